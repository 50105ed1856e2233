"""One model id served: a role (an engine, its adapter versions, its sampling defaults and chat-template
variables) or an engine's bare base model. ``RoleHandle`` is what ``RoleServer.role(model)`` hands out
(``client.RoleClient``): its tokenizer services run on the engine's tokenizer threads, its generations
hold a lease on the role's current adapter version for as long as they run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from vllm.exceptions import VLLMClientError
from vllm.v1.engine.exceptions import EngineDeadError

from ..config import SamplingDefaults
from .adapters import AdapterRegistry
from .client import (CompletionDelta, ContextLengthError, EngineUnavailable, InvalidGeneration, ModelUnloaded,
                     OutputReader, OutputReading, SamplingOptions)
from .output_parsers import EngineParsers
from .outputs import has_many_logprobs, sampling_params, to_deltas, to_deltas_in_slices
from .vllm_engine import VLLMEngine


class UsageObserver(Protocol):
    def record_usage(self, role: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                     num_images: int) -> None:
        """One finished request: the prompt tokens the engine ran (image tokens included), how many of them
        the prefix cache served, tokens generated, and images sent with it."""
        ...


@dataclass(frozen=True)
class RoleTarget:
    engine: VLLMEngine
    adapter_role: str | None
    """The role whose adapter versions serve this id (None: the bare base model)."""
    sampling: SamplingDefaults
    owned_by: str
    template_kwargs: dict[str, Any]
    """The role's ``chat_template_kwargs``."""


class RoleHandle:
    """One model id on its engine (implements ``client.RoleClient``)."""

    def __init__(self, name: str, target: RoleTarget, adapters: AdapterRegistry, parsers: EngineParsers,
                 usage: UsageObserver | None) -> None:
        """``parsers``: its engine's output parsers (``output_parsers.py``)."""
        self.name = name
        self.target = target
        self.engine = target.engine
        self._adapters = adapters
        self._parsers = parsers
        self._usage = usage

    def max_model_len(self) -> int:
        return self.engine.config.max_model_len

    def max_tokens_for(self, prompt_len: int, requested: int | None) -> int:
        """The completion budget of a request, or ``ContextLengthError`` if it cannot fit."""
        limit = self.max_model_len()
        if prompt_len >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens.")
        if requested is None:
            default = self.target.sampling.max_tokens
            return min(default, limit - prompt_len) if default else limit - prompt_len
        if prompt_len + requested > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the messages, {requested} in the completion).")
        return requested

    def vocab_size(self) -> int:
        return self.engine.vocab_size

    def supports_images(self) -> bool:
        return self.engine.supports_images

    async def render_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                          chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
        extra = {"tools": tools} if tools else {}
        template_kwargs = self.template_kwargs(chat_template_kwargs)

        def render(tokenizer: Any) -> list[int]:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 **extra, **template_kwargs)
            return tokenizer(text, add_special_tokens=False)["input_ids"]  # the batch path: frees the GIL

        return await self.engine.with_tokenizer(render)

    async def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return await self.engine.with_tokenizer(
            lambda tokenizer: tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    async def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens) under the model's tokenizer."""
        return await self.tokenize(text, add_special_tokens=False)

    async def detokenize(self, token_ids: list[int]) -> str:
        vocab_size = len(self.engine.tokenizer)
        bad = [i for i in token_ids if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of the vocabulary (0 to {vocab_size - 1})")
        return await self.engine.with_tokenizer(lambda tokenizer: tokenizer.decode(token_ids))

    async def extend_chat(self, ids: list[int], user_text: str) -> list[int]:
        """``ids`` (a prompt and the completion sampled for it) continued by a user turn and the generation
        prompt, in token space: the conversation stays the tokens that were sampled."""
        template_kwargs = self.target.template_kwargs

        def extend(tokenizer: Any) -> list[int]:
            glue = turn_glue(tokenizer, user_text, **template_kwargs)
            if ids and glue and ids[-1] == glue[0]:  # the sampled end-of-turn token is already there
                glue = glue[1:]
            return [*ids, *glue]

        return await self.engine.with_tokenizer(extend)

    def template_kwargs(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The chat-template variables of a prompt: the role's ``chat_template_kwargs``, ``extra`` (a
        request's) over them."""
        return {**self.target.template_kwargs, **extra} if extra else self.target.template_kwargs

    def parses_tool_calls(self) -> bool:
        return self._parsers.has_tools

    def output_reader(self, reading: OutputReading) -> OutputReader | None:
        reading = msgspec.structs.replace(reading,
                                          chat_template_kwargs=self.template_kwargs(reading.chat_template_kwargs))
        return self._parsers.reader(reading, self.engine.with_tokenizer)  # the parsers hold the tokenizer

    async def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str, *, stream: bool,
        images: Sequence[Any] = (),
    ) -> AsyncIterator[list[CompletionDelta]]:
        engine = self.engine
        if images and not engine.supports_images:
            raise InvalidGeneration(f"Model `{self.name}` does not take images: its engine `{engine.name}` serves "
                                    "a text-only model (or runs with language_model_only).", "messages")
        try:
            params = sampling_params(options, self.target.sampling, stream)
        except (ValueError, VLLMClientError) as err:
            raise InvalidGeneration(str(err), getattr(err, "parameter", None)) from None
        role = self.target.adapter_role
        if role and not self._adapters.serves(role, engine):  # unloaded since the request found this handle
            raise ModelUnloaded(self.name)
        lease = self._adapters.acquire(role) if role else nullcontext(None)
        template_kwargs = self.template_kwargs(options.chat_template_kwargs)
        async with lease as lora, aclosing(engine.generate(
                prompt_ids, params, request_id, lora, options.affinity_key, images,
                **self._reasoning_args(options, template_kwargs))) as outputs:
            try:
                num_generated = 0
                async for output in outputs:
                    num_generated += sum(len(c.token_ids) for c in output.outputs)
                    if output.finished and self._usage is not None:
                        self._usage.record_usage(self.name, len(output.prompt_token_ids or prompt_ids),
                                                 output.num_cached_tokens or 0, num_generated, len(images))
                    deltas = await to_deltas_in_slices(output, options.logprobs) \
                        if has_many_logprobs(output, options.logprobs) else to_deltas(output, options.logprobs)
                    if options.split_thinking and output.finished and self._parsers.has_reasoning:
                        await self._split_thinking(deltas, prompt_ids, template_kwargs)
                    yield deltas
            except EngineDeadError as err:
                raise EngineUnavailable(f"engine {engine.name} is not running: {err}") from None
            except (ValueError, VLLMClientError) as err:  # some checks run only when the request is added
                raise InvalidGeneration(str(err), getattr(err, "parameter", None)) from None

    def _reasoning_args(self, options: SamplingOptions, template_kwargs: dict[str, Any]) -> dict[str, Any]:
        """What the engine's structured-output gate reads of a constrained request on an engine with a
        reasoning parser (as vLLM's chat serving passes them): whether the thinking already ended, and the
        template variables its reasoning parser is built with."""
        if not self._parsers.has_reasoning or (options.regex is None and options.json_schema is None):
            return {}
        return {"reasoning_ended": options.reasoning_ended,
                "reasoning_kwargs": {"chat_template_kwargs": dict(template_kwargs)}}

    async def _split_thinking(self, deltas: list[CompletionDelta], prompt_ids: list[int],
                              template_kwargs: dict[str, Any]) -> None:
        """Each whole completion's ``content``: its text after the thinking, by the engine's reasoning parser."""
        parsers = self._parsers

        def split(_: Any) -> list[str | None]:
            return [parsers.content_after_thinking(d.text, d.token_ids, prompt_ids, template_kwargs) for d in deltas]

        for delta, content in zip(deltas, await self.engine.with_tokenizer(split)):
            delta.content = content


_SENTINEL = "\u2063MIA-ASSISTANT-TURN\u2063"


def turn_glue(tokenizer: Any, user_text: str, **template_kwargs: Any) -> list[int]:
    """The tokens the chat template puts between an assistant turn's content and the next assistant turn:
    end of turn, the user's message, the generation prompt. Found by rendering a conversation whose
    assistant content is a sentinel and keeping what follows it."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "-"}, {"role": "assistant", "content": _SENTINEL},
         {"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True, **template_kwargs)
    _, found, after = text.partition(_SENTINEL)
    if not found:
        raise ValueError("the chat template does not render assistant content verbatim")
    return tokenizer.encode(after, add_special_tokens=False)
