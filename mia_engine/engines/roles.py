"""Roles on engines: the ``EngineClient`` the HTTP layer and the agent talk to.

Each role (planner, executor, manager, and aliases such as judge -> manager) is a model id that maps
to an engine, an optional versioned LoRA adapter and sampling defaults; each engine's name is also a
model id, for its bare base model. Roles on the same base model share one engine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vllm import SamplingParams
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.exceptions import VLLMClientError
from vllm.v1.engine.exceptions import EngineDeadError

from ..config import MIAConfig, SamplingDefaults, resolve_role
from ..models.cache import default_home
from ..models.embedded import adapter_dir, model_dir
from .adapters import AdapterRegistry
from .client import (CompletionDelta, ContextLengthError, EngineUnavailable, ExtractedToolCalls, InvalidGeneration,
                     ModelCard, SamplingOptions, TokenLogprob, TopLogprob)
from .platforms import Platform, resolve_platform
from .startup import applied_env, process_state_kept, start_groups, use_spawn
from .tool_parsers import ToolCallParser, check_tool_call_parsers
from .vllm_engine import VLLMEngine
from .warmup import warm_up

log = logging.getLogger(__name__)


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


class RoleServer:
    """Starts the engines of a config and serves its roles; implements ``EngineClient``."""

    def __init__(self, config: MIAConfig, platform: Platform | None = None) -> None:
        """Build it in the main thread, before any engine starts: it makes vLLM spawn its processes.
        ``platform``: the one the server resolved (None: resolve it here)."""
        use_spawn()
        self.config = config
        self.platform = platform or resolve_platform(config.cpu)
        self.home = Path(config.models.home).expanduser() if config.models.home else default_home()
        self.adapters = AdapterRegistry()
        self.engines: dict[str, VLLMEngine] = {}
        self._targets: dict[str, RoleTarget] = {}
        self._tool_parsers: dict[str, ToolCallParser] = {}
        """Engine name -> its tool-call parser (engines with ``tool_call_parser`` set)."""
        self._is_started = False
        self._error: str | None = None
        self.initial_adapters: dict[str, Path] = {}
        """Adapter folders that replace a role's configured one at start (the latest learned checkpoint)."""
        self._warming_up: str | None = None
        """The engine warming up now (``warmup.py``), for the 503 while the server starts."""
        self.usage: UsageObserver | None = None
        """Told about every finished request (the server's per-role token and prefix-cache metrics)."""

    async def start(self) -> None:
        """Build/resolve models, spawn the engines (concurrently where ``start_groups`` allows), load
        adapters; failures are kept, not raised."""
        try:
            await self._start()
            self._is_started = True
            log.info("ready: serving %s", ", ".join(self._targets))
        except Exception as err:
            self._error = f"engine start failed: {type(err).__name__}: {err}"
            log.exception("engine start failed")

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        config_lock = threading.Lock()
        check_tool_call_parsers(self.config)  # before any engine starts
        envs = {name: self.platform.spawn_env(engine) for name, engine in self.config.engines.items()}
        for group in start_groups(self.config.engines, envs):
            engines = []
            for name in group:
                engine_config = self.config.engines[name]
                path = await loop.run_in_executor(None, model_dir, engine_config.model, self.home)
                engines.append(VLLMEngine(name, engine_config, path, self.platform))
                log.info("starting engine %s from %s", name, path)
            results = await start_together(engines, config_lock, envs[group[0]])
            for engine in engines:  # registered even when a sibling failed, so shutdown() stops them
                self.engines[engine.name] = engine
                self._targets[engine.name] = RoleTarget(engine, None, SamplingDefaults(), "engine", {})
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            for engine in engines:
                if engine.config.tool_call_parser:
                    self._tool_parsers[engine.name] = ToolCallParser(engine.name, engine.config.tool_call_parser,
                                                                     engine.tokenizer)
        for name in self.config.roles:
            canonical, role = resolve_role(self.config, name)
            engine = self.engines[role.engine]
            if role.adapter and canonical == name:
                path = self.initial_adapters.get(name) or await loop.run_in_executor(
                    None, adapter_dir, role.adapter, self.config.engines[role.engine].model, self.home)
                await self.adapters.register(name, engine, path)
            self._targets[name] = RoleTarget(engine, canonical if role.adapter else None, role.sampling, "role",
                                             dict(role.chat_template_kwargs))
        for engine in self.engines.values():
            if engine.config.warmup_max_seqs:
                await self._warm_up(engine)

    async def _warm_up(self, engine: VLLMEngine) -> None:
        """``engines/warmup.py`` on ``engine``, with the base model and every adapter of its roles."""
        roles = sorted({t.adapter_role for t in self._targets.values() if t.engine is engine and t.adapter_role})
        self._warming_up = engine.name
        try:
            async with AsyncExitStack() as leases:
                loras = [None, *[await leases.enter_async_context(self.adapters.acquire(role)) for role in roles]]
                await warm_up(engine, loras, engine.config.warmup_max_seqs)
        finally:
            self._warming_up = None

    def shutdown(self) -> None:
        for engine in self.engines.values():
            engine.shutdown()

    def failure(self) -> str | None:
        """Why the engines cannot serve, in one line: their start failed, or a started engine died (its
        vLLM engine core stopped). None: up, or still starting."""
        if self._error:
            return self._error
        dead = [name for name, engine in self.engines.items() if self._is_started and not engine.is_running]
        if dead:
            return (f"engine {', '.join(dead)} died: its vLLM engine core stopped unexpectedly (vLLM's log above "
                    "says how)")
        return None

    # --- EngineClient ---------------------------------------------------------------------------

    def models(self) -> list[ModelCard]:
        cards = []
        for model_id, target in self._targets.items():
            version = self.adapters.current(target.adapter_role) if target.adapter_role else None
            cards.append(ModelCard(model_id, target.owned_by, str(target.engine.model_dir),
                                   version.version if version else None))
        return cards

    def has_model(self, model: str) -> bool:
        return model in self.config.roles or model in self.config.engines

    def is_ready(self) -> bool:
        return self._is_started and all(e.is_running for e in self.engines.values())

    def not_ready_reason(self) -> str:
        if self._error:
            return self._error
        dead = [name for name, e in self.engines.items() if not e.is_running]
        if self._is_started and dead:
            return f"engine {', '.join(dead)} is not running"
        if self._warming_up is not None:
            return f"{self.progress()}; retry shortly"
        return "the engines are starting; retry shortly"

    def progress(self) -> str:
        """What ``/health`` may show anyone while the engines start: the engine warming up, if one is."""
        return f"engine {self._warming_up} is warming up" if self._warming_up is not None else ""

    def max_model_len(self, model: str) -> int:
        return self._targets[model].engine.config.max_model_len

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        """The completion budget of a request, or ``ContextLengthError`` if it cannot fit."""
        limit = self.max_model_len(model)
        if prompt_len >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens.")
        if requested is None:
            default = self._targets[model].sampling.max_tokens
            return min(default, limit - prompt_len) if default else limit - prompt_len
        if prompt_len + requested > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the messages, {requested} in the completion).")
        return requested

    def vocab_size(self, model: str) -> int:
        target = self._targets.get(model)
        return target.engine.vocab_size if target is not None else 0

    def supports_images(self, model: str) -> bool:
        target = self._targets.get(model)
        return target is not None and target.engine.supports_images

    async def render_chat(self, model: str, messages: list[dict[str, Any]], *,
                          tools: list[dict[str, Any]] | None = None) -> list[int]:
        target = self._targets[model]
        extra = {"tools": tools} if tools else {}

        def render(tokenizer: Any) -> list[int]:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 **extra, **target.template_kwargs)
            return tokenizer(text, add_special_tokens=False)["input_ids"]  # the batch path: frees the GIL

        return await target.engine.with_tokenizer(render)

    async def tokenize(self, model: str, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return await self._targets[model].engine.with_tokenizer(
            lambda tokenizer: tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        engine = self._targets[model].engine
        vocab_size = len(engine.tokenizer)
        bad = [i for i in token_ids if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of the vocabulary (0 to {vocab_size - 1})")
        return await engine.with_tokenizer(lambda tokenizer: tokenizer.decode(token_ids))

    def parses_tool_calls(self, model: str) -> bool:
        target = self._targets.get(model)
        return target is not None and target.engine.name in self._tool_parsers

    def skips_special_tokens(self, model: str, tools: list[dict[str, Any]]) -> bool:
        return self._tool_parsers[self._targets[model].engine.name].skips_special_tokens(tools)

    async def extract_tool_calls(self, model: str, text: str, tools: list[dict[str, Any]]) -> ExtractedToolCalls:
        engine = self._targets[model].engine
        parser = self._tool_parsers[engine.name]
        return await engine.with_tokenizer(lambda _: parser.extract(text, tools))  # the parser holds the tokenizer

    async def extend_chat(self, model: str, ids: list[int], user_text: str) -> list[int]:
        target = self._targets[model]

        def extend(tokenizer: Any) -> list[int]:
            glue = turn_glue(tokenizer, user_text, **target.template_kwargs)
            if ids and glue and ids[-1] == glue[0]:  # the sampled end-of-turn token is already there
                glue = glue[1:]
            return [*ids, *glue]

        return await target.engine.with_tokenizer(extend)

    async def encode(self, model: str, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens) under the model's tokenizer."""
        return await self._targets[model].engine.with_tokenizer(
            lambda tokenizer: tokenizer(text, add_special_tokens=False)["input_ids"])

    async def generate(
        self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *, stream: bool,
        images: Sequence[Any] = (),
    ) -> AsyncIterator[list[CompletionDelta]]:
        target = self._targets[model]
        if images and not target.engine.supports_images:
            raise InvalidGeneration(f"Model `{model}` does not take images: its engine `{target.engine.name}` serves "
                                    "a text-only model (or runs with language_model_only).", "messages")
        try:
            params = sampling_params(options, target.sampling, stream)
        except (ValueError, VLLMClientError) as err:
            raise InvalidGeneration(str(err), getattr(err, "parameter", None)) from None
        lease = self.adapters.acquire(target.adapter_role) if target.adapter_role else nullcontext(None)
        async with lease as lora, aclosing(target.engine.generate(
                prompt_ids, params, request_id, lora, options.affinity_key, images)) as outputs:
            try:
                num_generated = 0
                async for output in outputs:
                    num_generated += sum(len(c.token_ids) for c in output.outputs)
                    if output.finished and self.usage is not None:
                        self.usage.record_usage(model, len(output.prompt_token_ids or prompt_ids),
                                                output.num_cached_tokens or 0, num_generated, len(images))
                    yield await to_deltas_in_slices(output, options.logprobs) \
                        if _has_many_logprobs(output, options.logprobs) else to_deltas(output, options.logprobs)
            except EngineDeadError as err:
                raise EngineUnavailable(f"engine {target.engine.name} is not running: {err}") from None
            except (ValueError, VLLMClientError) as err:  # some checks run only when the request is added
                raise InvalidGeneration(str(err), getattr(err, "parameter", None)) from None


async def start_together(engines: Sequence[VLLMEngine], config_lock: threading.Lock,
                         env: Mapping[str, str]) -> list[BaseException | None]:
    """Start a group of engines concurrently (``startup.start_groups`` made it); one result per engine,
    an exception where it failed. The group's spawn environment ``env`` (the platform's ``spawn_env``, the same
    for every member) is set around the starts, and what vLLM changes in this process meanwhile is
    undone once they are up (``startup.process_state_kept``)."""
    with applied_env(env), process_state_kept(env):
        results = await asyncio.gather(*(e.start(config_lock) for e in engines), return_exceptions=True)
    return [result if isinstance(result, BaseException) else None for result in results]


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


def sampling_params(options: SamplingOptions, defaults: SamplingDefaults, stream: bool) -> SamplingParams:
    """vLLM sampling parameters: the request's values over the role's defaults."""
    structured = None
    if options.regex is not None or options.json_schema is not None:
        structured = StructuredOutputsParams(regex=options.regex, json=options.json_schema)
    return SamplingParams(
        n=options.n,
        temperature=defaults.temperature if options.temperature is None else options.temperature,
        top_p=defaults.top_p if options.top_p is None else options.top_p,
        top_k=defaults.top_k if options.top_k is None else options.top_k,
        min_p=options.min_p or 0.0,
        repetition_penalty=1.0 if options.repetition_penalty is None else options.repetition_penalty,
        presence_penalty=defaults.presence_penalty if options.presence_penalty is None else options.presence_penalty,
        frequency_penalty=options.frequency_penalty or 0.0,
        logit_bias=options.logit_bias or None,
        min_tokens=options.min_tokens,
        ignore_eos=options.ignore_eos,
        max_tokens=options.max_tokens,
        stop=options.stop or None,
        seed=options.seed,
        logprobs=options.logprobs,
        flat_logprobs=True,  # vLLM keeps them as a few flat lists, not a dict and Logprob objects per token
        structured_outputs=structured,
        skip_special_tokens=options.skip_special_tokens,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
    )


MAX_LOGPROBS_ON_LOOP = 4096
"""Log-prob objects converted between two turns of the event loop (an output with more is converted in
slices of about this many: a few milliseconds each)."""


def _has_many_logprobs(output: RequestOutput, num_logprobs: int | None) -> bool:
    """Whether converting ``output`` builds more than ``MAX_LOGPROBS_ON_LOOP`` log-prob objects (a whole
    completion with n = 16, 20 top candidates and 4096 tokens builds over a million)."""
    if num_logprobs is None:
        return False
    return sum(len(c.token_ids) for c in output.outputs) * (num_logprobs + 1) > MAX_LOGPROBS_ON_LOOP


def to_deltas(output: RequestOutput, num_logprobs: int | None) -> list[CompletionDelta]:
    return [
        CompletionDelta(c.index, c.text, len(c.token_ids),
                        _logprobs(c, num_logprobs) if num_logprobs is not None else None,
                        c.finish_reason, list(c.token_ids))
        for c in output.outputs
    ]


async def to_deltas_in_slices(output: RequestOutput, num_logprobs: int) -> list[CompletionDelta]:
    """``to_deltas`` with the log-probs converted slice by slice, giving the event loop a turn between slices
    (in a thread they would still hold the GIL; a whole completion can carry over a million of them)."""
    num_tokens = max(1, MAX_LOGPROBS_ON_LOOP // (num_logprobs + 1))
    deltas = []
    for c in output.outputs:
        logprobs: list[TokenLogprob] = []
        for start in range(0, len(c.token_ids), num_tokens):
            logprobs += _logprobs(c, num_logprobs, start, start + num_tokens)
            await asyncio.sleep(0)
        deltas.append(CompletionDelta(c.index, c.text, len(c.token_ids), logprobs, c.finish_reason,
                                      list(c.token_ids)))
    return deltas


def _logprobs(completion: CompletionOutput, num_top: int, start: int = 0, stop: int | None = None
              ) -> list[TokenLogprob]:
    """Positions ``start:stop`` of the completion's log-probs, read straight from vLLM's ``FlatLogprobs``
    (``flat_logprobs``): at each position the sampled token comes first, then the top candidates by rank."""
    flat = completion.logprobs
    if not flat:
        return []
    starts, ends, tokens, values = flat.start_indices, flat.end_indices, flat.decoded_tokens, flat.logprobs
    result = []
    for position in range(start, len(starts) if stop is None else min(stop, len(starts))):
        first, end = starts[position], ends[position]
        top = [TopLogprob(tokens[i] or "", values[i]) for i in range(first + 1, min(end, first + 1 + num_top))]
        result.append(TokenLogprob(tokens[first] or "", values[first], top))
    return result
