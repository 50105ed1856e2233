"""The interface between the HTTP layer (and the agent) and the engines, with its typed messages.

Handlers depend on ``EngineClient`` only, so the API can be exercised with a fake and the engines with
the real thing. A served model id (``planner``, ``executor``, ... or an engine's name for its bare base
model) is one ``RoleClient``, asked for once (``client.role(model)``) and then called without a name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Protocol

import msgspec


class InvalidGeneration(ValueError):
    """The engine refused the request's parameters (e.g. ``n > 1`` with greedy sampling)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelUnloaded(InvalidGeneration):
    """The model id was unloaded (``POST /v1/unload_lora_adapter``) after the request found it."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` was unloaded.", "model")


class EngineUnavailable(RuntimeError):
    """The engine behind the model is dead or shutting down."""


class ContextLengthError(ValueError):
    """The prompt (plus the requested completion) does not fit the model's context."""


class ModelCard(msgspec.Struct, frozen=True):
    """One served model id, as ``/v1/models`` lists it (vLLM's ``ModelCard`` fields)."""

    id: str
    owned_by: str
    """``role`` for a role, ``engine`` for a bare base model, ``agent`` for the research agent."""
    root: str
    """What the id is served from: a base model's Hugging Face id, or its folder (an embedded model's built
    one); the base model's for a role (an adapter's folder is ``adapter_path``)."""
    adapter_version: int | None = None
    parent: str | None = None
    """The model id of the base model a role runs on (None for a base model, the agent, the encoder)."""
    max_model_len: int | None = None
    """The context length of the id's engine, in tokens (None: not one engine's)."""
    adapter_path: str | None = None
    """The folder of the adapter version the id serves now (None: no adapter); ``/v1/models`` shows it as
    ``root`` to the admin scope only, as ``/v1/adapters`` shows it."""


class SamplingOptions(msgspec.Struct, frozen=True):
    """What one generation asks for; ``None`` takes the role's default."""

    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = []
    seed: int | None = None
    logprobs: int | None = None
    """Top log-probs per generated token (0 = only the sampled token's); ``None`` = none."""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    """Sample from the k most likely tokens (0 or -1: all); ``None`` takes the role's default."""
    min_p: float | None = None
    """Drop tokens less likely than this fraction of the most likely one (0: off)."""
    repetition_penalty: float | None = None
    """Multiplies down tokens already in the prompt or output (1: off)."""
    logit_bias: dict[int, float] | None = None
    """Added to the logits of these token ids before sampling (already clamped to [-100, 100])."""
    min_tokens: int = 0
    """Tokens generated before an end-of-sequence or stop string may end the completion."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (until ``max_tokens`` or a stop string)."""
    regex: str | None = None
    """Constrain the output to this regular expression (structured outputs)."""
    json_schema: dict | None = None
    """Constrain the output to JSON of this schema (structured outputs)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text (vLLM's default); a tool-call parser may need its tags kept."""
    affinity_key: str | None = None
    """Requests with the same key go to the same data-parallel replica (``EngineConfig.routing``): the
    agent passes its rollout id so a rollout's later turns reuse the replica's prefix cache."""
    reasoning_ended: bool | None = None
    """Where the engine has a reasoning parser (``EngineConfig.reasoning_parser``) and the request a
    constraint (``regex``, ``json_schema``): True applies the constraint from the first token, as on an
    engine without one; None lets the engine's reasoning parser start it once the thinking ends, deciding
    from the prompt whether it already has (vLLM's default: a reasoning model thinks freely, then answers
    in the constrained form). No effect elsewhere."""
    chat_template_kwargs: dict[str, Any] | None = None
    """The chat-template variables the prompt was rendered with, beyond the role's own (a request's
    ``chat_template_kwargs``): the engine's reasoning parser reads them too (Qwen3's ``enable_thinking``)."""
    split_thinking: bool = False
    """A whole (non-streamed) completion comes with ``CompletionDelta.content``, the text after its
    thinking as the engine's reasoning parser reads it; nothing on an engine without one."""


class TopLogprob(msgspec.Struct, frozen=True, gc=False):
    """(Untracked by the garbage collector, as ``TokenLogprob``: a completion can hold a million of them, and
    a full collection walks every tracked object with the event loop waiting.)"""

    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, gc=False):
    token: str
    logprob: float
    top: list[TopLogprob] = []


class CompletionDelta(msgspec.Struct):
    """New output of one of the ``n`` completions since the last delta (the whole output when final)."""

    index: int
    text: str
    num_tokens: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    token_ids: list[int] = []
    """The sampled token ids behind ``text`` (the end-of-sequence token included when it was sampled):
    the learner trains on exactly these, and a conversation continued in token space stays on-policy."""
    content: str | None = None
    """With ``SamplingOptions.split_thinking`` on an engine with a reasoning parser, a whole completion's
    text after its thinking ("" when it is all thinking), as vLLM's ``message.content``; None otherwise."""


class ParsedToolCall(msgspec.Struct, frozen=True):
    """One call a tool-call parser read from a completion."""

    name: str
    arguments: str
    """The arguments as JSON text."""
    id: str | None = None
    """The parser's call id (None: the server makes one)."""


class OutputReading(msgspec.Struct, frozen=True):
    """What a chat request asks its engine's output parsers to read (``RoleClient.output_reader``)."""

    prompt_ids: list[int]
    """The rendered prompt: a prompt that already ended the thinking leaves none to split off."""
    chat_template_kwargs: dict[str, Any] = {}
    """The request's variables of the chat template (the role adds its own under them): some reasoning
    parsers read them (Qwen3's ``enable_thinking``)."""
    tools: list[dict[str, Any]] | None = None
    """The request's function definitions (None: no tools)."""
    calls: Literal["none", "auto", "required", "named"] = "none"
    """How the completion holds calls: none read; ``auto``, the model's own syntax read by the engine's
    tool-call parser; ``required``, a JSON list of ``{"name", "parameters"}`` (forced by a grammar);
    ``named``, the arguments of ``function`` as JSON (forced)."""
    function: str = ""
    """The forced function's name (``calls == "named"``)."""


class ParsedOutput(msgspec.Struct, frozen=True):
    """A whole completion, read: its thinking, the content after it, and its calls."""

    reasoning: str | None
    """The thinking (None: the engine has no reasoning parser, or the prompt ended the thinking)."""
    content: str | None
    """What follows the thinking, less the calls (None when nothing, or only whitespace, is left)."""
    calls: list[ParsedToolCall] | None = None
    """The calls read (None: no calls were to be read, or an ``auto`` completion called none). A forced
    completion cut short by ``max_tokens`` holds each call whose name was complete, its arguments as far
    as they were generated (as the stream sent them)."""


class ToolCallDelta(msgspec.Struct, frozen=True):
    """A piece of a streamed call: the first of a call carries its id and name, the later ones argument
    text only (OpenAI's stream format)."""

    index: int
    """The call's place among the completion's calls."""
    id: str | None = None
    name: str | None = None
    arguments: str | None = None
    """The next piece of the arguments' JSON text."""


class OutputDelta(msgspec.Struct, frozen=True):
    """What a streamed piece of a completion adds, read."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] = []


class ChoiceReader(Protocol):
    """Reads one completion (one of the ``n``), whole or as it streams: it keeps state while a stream goes."""

    async def whole(self, text: str, token_ids: list[int]) -> ParsedOutput:
        """A finished completion, read (off the event loop)."""
        ...

    def delta(self, text: str, token_ids: list[int], *, finished: bool) -> OutputDelta | None:
        """The next streamed piece (its text and token ids), read; None: nothing to send yet (e.g. a tag
        of the call syntax, held until the parser knows what it opens)."""
        ...


class OutputReader(Protocol):
    """A chat request's reading of its completions (``RoleClient.output_reader``)."""

    reads_reasoning: bool
    """The engine's reasoning parser splits the thinking off (it has one, and the prompt did not end the
    thinking already): a constraint then starts once the thinking ends (``SamplingOptions.reasoning_ended``)."""
    skip_special_tokens: bool
    """Whether the completion may be detokenized without special tokens: a parser whose tags are special
    tokens in some models (Hermes' ``<tool_call>``) asks for them to be kept, as it does in ``vllm serve``."""

    def choice(self) -> ChoiceReader:
        """A fresh reader of one completion."""
        ...


class RoleClient(Protocol):
    """One model id served (a role, or an engine's bare base model): ``EngineClient.role(model)``."""

    name: str

    def max_model_len(self) -> int: ...

    def max_tokens_for(self, prompt_len: int, requested: int | None) -> int:
        """The completion budget of a request: ``requested``, or (None) the role's default capped by the
        context left after the prompt. Raises ``ContextLengthError`` when the prompt leaves no room."""
        ...

    def vocab_size(self) -> int:
        """The vocabulary of the model's engine in tokens; 0 when unknown."""
        ...

    def supports_images(self) -> bool:
        """Requests may carry images (the engine serves a vision-language model)."""
        ...

    async def render_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                          chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Apply the model's chat template (with the generation prompt) and tokenize. A message's content
        is a string, or (on a model that takes images) a list of ``{"type": "text", "text": ...}`` and
        ``{"type": "image"}`` parts; each image part becomes the template's image placeholder. ``tools``:
        OpenAI function definitions, handed to the template (which describes them to the model).
        ``chat_template_kwargs``: variables of the template over the role's own (a request's; they win)."""
        ...

    async def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` under the model's tokenizer (off the event loop: a text can be long)."""
        ...

    async def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        ...

    async def detokenize(self, token_ids: list[int]) -> str:
        """The text of ``token_ids``; raises ``ValueError`` for an id out of the vocabulary."""
        ...

    async def extend_chat(self, ids: list[int], user_text: str) -> list[int]:
        """``ids`` (a chat ending in an assistant completion) + a new user turn + the next assistant prompt,
        in token space: earlier turns are neither re-rendered nor re-tokenized."""
        ...

    def parses_tool_calls(self) -> bool:
        """The engine has a tool-call parser (``EngineConfig.tool_call_parser``), so it can answer
        ``tool_choice: "auto"``."""
        ...

    def output_reader(self, reading: OutputReading) -> OutputReader | None:
        """How a chat request's completions are read, by vLLM's parsers as ``vllm serve`` reads them: the
        engine's reasoning parser splits the thinking off, its tool-call parser reads ``auto`` calls, and
        forced calls are read from their JSON. None: there is nothing to read (the text is all content)."""
        ...

    def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str, *, stream: bool,
        images: Sequence[Any] = (),
    ) -> AsyncIterator[list[CompletionDelta]]:
        """Yield deltas while generating (``stream``) or once with every completion whole. ``images``:
        decoded RGB images for the prompt's image placeholders, in order.

        Raises ``InvalidGeneration`` or ``EngineUnavailable`` (at the first ``anext`` at the latest)."""
        ...


class EngineClient(Protocol):
    def models(self) -> list[ModelCard]: ...

    def has_model(self, model: str) -> bool:
        """The model id is configured (it may not be served yet)."""
        ...

    def role(self, model: str) -> RoleClient:
        """The handle of a served model id; ``KeyError`` for one that is not (or not yet) served."""
        ...

    def find(self, model: str) -> RoleClient | None:
        """``role``, or None for a model id that is not served."""
        ...

    def is_ready(self) -> bool: ...

    def not_ready_reason(self) -> str: ...
