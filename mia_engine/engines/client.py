"""The interface between the HTTP layer (and the agent) and the engines, with its typed messages.

Handlers depend on ``EngineClient`` only, so the API can be exercised with a fake and the engines with
the real thing. A served model id (``planner``, ``executor``, ... or an engine's name for its bare base
model) is one ``RoleClient``, asked for once (``client.role(model)``) and then called without a name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import msgspec


class InvalidGeneration(ValueError):
    """The engine refused the request's parameters (e.g. ``n > 1`` with greedy sampling)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineUnavailable(RuntimeError):
    """The engine behind the model is dead or shutting down."""


class ContextLengthError(ValueError):
    """The prompt (plus the requested completion) does not fit the model's context."""


class ModelCard(msgspec.Struct, frozen=True):
    id: str
    owned_by: str
    """``role`` for a role, ``engine`` for a bare base model, ``agent`` for the research agent."""
    root: str
    """The base model folder the id is served from."""
    adapter_version: int | None = None


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


class ParsedToolCall(msgspec.Struct, frozen=True):
    """One call a tool-call parser read from a completion."""

    name: str
    arguments: str
    """The arguments as JSON text."""
    id: str | None = None
    """The parser's call id (None: the server makes one)."""


class ExtractedToolCalls(msgspec.Struct, frozen=True):
    """A finished completion read by a tool-call parser: its calls and the content around them."""

    content: str | None
    calls: list[ParsedToolCall]
    """Empty: the model called no tool (``content`` is then the whole text)."""


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

    async def render_chat(self, messages: list[dict[str, Any]], *,
                          tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Apply the model's chat template (with the generation prompt) and tokenize. A message's content
        is a string, or (on a model that takes images) a list of ``{"type": "text", "text": ...}`` and
        ``{"type": "image"}`` parts; each image part becomes the template's image placeholder. ``tools``:
        OpenAI function definitions, handed to the template (which describes them to the model)."""
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

    def skips_special_tokens(self, tools: list[dict[str, Any]]) -> bool:
        """Whether an ``auto`` completion with these ``tools`` may be detokenized without special tokens
        (False where the engine's tool-call parser needs its call tags, which some models mark special)."""
        ...

    async def extract_tool_calls(self, text: str, tools: list[dict[str, Any]]) -> ExtractedToolCalls:
        """The tool calls in a finished ``auto`` completion, read by the engine's tool-call parser (off the
        event loop)."""
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
