"""OpenAI chat-completions request and response bodies, validated and encoded by msgspec.

Unknown request fields are ignored (as vLLM's server does) so that newer clients keep working;
known fields are type- and range-checked, and a violation names the field in the 400 response.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

MAX_INT = 2**31 - 1
"""Largest count, length or token id a request may carry: vLLM's engine serialises such fields as fixed-width
integers, so a larger one is refused here with a 400 naming the field, not deep inside the engine."""
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
"""A sampling seed: any 64-bit signed integer."""


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageURL(msgspec.Struct):
    url: str
    detail: str | None = None


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    image_url: ImageURL


ContentPart = TextPart | ImagePart


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str
    """The arguments as JSON text."""


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant turn's calls, handed back to the chat template in a conversation that continues."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers."""


class FunctionDefinition(msgspec.Struct):
    name: Annotated[str, Meta(min_length=1)]
    description: str | None = None
    parameters: dict | None = None
    """The arguments' JSON schema (none: no arguments)."""
    strict: bool | None = None


class Tool(msgspec.Struct):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    """``tool_choice`` naming the function to call."""

    type: Literal["function"]
    function: NamedFunction


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class StructuredOutputs(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` extension: constrain the completion (one of the three)."""

    regex: str | None = None
    json: dict | str | None = None
    """A JSON schema (object or its JSON text)."""
    choice: Annotated[list[str], Meta(min_length=1)] | None = None
    """The completion is exactly one of these strings."""


class JsonSchemaFormat(msgspec.Struct):
    name: str = ""
    schema: dict | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON of a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(msgspec.Struct, kw_only=True):
    """The fields the chat and text-completion requests share (``sampling.sampling_options`` reads them): a
    base of both, so each field is declared and checked once. Keyword-only: the subclasses' own fields come
    first (``model``, then ``messages`` or ``prompt``)."""

    n: Annotated[int, Meta(ge=1, le=MAX_INT)] = 1
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    logit_bias: dict[str, float] | None = None
    """Token id (as a string) -> bias added to its logit, clamped to [-100, 100] (as vLLM does)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's sampling extensions.
    top_k: Annotated[int, Meta(ge=-1, le=MAX_INT)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None
    min_tokens: Annotated[int, Meta(ge=0, le=MAX_INT)] = 0
    ignore_eos: bool = False


class ChatCompletionRequest(SamplingFields):
    model: str
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_INT)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1, le=MAX_INT)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """Default: ``auto`` with ``tools``, else ``none``; ``required`` and a named function are enforced by
    structured outputs (as vLLM does); ``auto`` needs the engine's tool-call parser (a 400 without one)."""
    parallel_tool_calls: bool | None = None
    """``false``: at most one call under ``tool_choice`` ``required`` or ``auto``."""
    chat_template_kwargs: dict[str, bool | int | float | str | None] | None = None
    """vLLM's extension: variables of the chat template for this prompt, over the role's own
    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": false}``); bounded (``template_kwargs.py``)."""
    chat_template: str | None = None
    """vLLM's extension (a Jinja template for this request): refused with a 400, as ``vllm serve`` refuses it
    without ``--trust-request-chat-template``."""
    functions: list | None = None
    """OpenAI's deprecated function calling: refused (use ``tools``)."""
    function_call: str | dict | None = None
    """OpenAI's deprecated function calling: refused (use ``tool_choice``)."""
    # Research-agent fields (model ``mia``); ignored by the raw roles.
    ground_truth: str | list[str] | None = None
    """Acceptable answers: the judge grades against them (supervised)."""
    rollouts: Annotated[int, Meta(ge=1, le=MAX_INT)] | None = None
    """G, plans sampled and executed; default: the agent's low-latency setting (1), or with ``learn`` the
    learning G (``agent.num_rollouts``, 4)."""
    learn: bool = False
    """Judge, reward and store experience from this question (test-time learning)."""
    return_trace: bool = False
    """Include every rollout's turns and observations in the ``mia`` object."""
    data_id: str | None = None
    """The question's key in the image-search cache (``tools.image_cache_dir``)."""


class TopLogprobOut(msgspec.Struct, gc=False):
    """(Untracked by the garbage collector, as the engine client's ``TopLogprob``, and ``bytes`` a tuple, which
    the collector untracks once it holds only ints: a response can hold a million of these, and a full
    collection walks every tracked object with the event loop waiting.)"""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None


class TokenLogprobOut(msgspec.Struct, gc=False):
    token: str
    logprob: float
    bytes: tuple[int, ...] | None
    top_logprobs: list[TopLogprobOut]


class ChoiceLogprobs(msgspec.Struct):
    content: list[TokenLogprobOut] | None


class AssistantMessage(msgspec.Struct):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET
    reasoning_content: str | None | msgspec.UnsetType = msgspec.UNSET
    """The thinking, split off by the engine's reasoning parser (``engines.<name>.reasoning_parser``; absent
    without one)."""


class Choice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None
    object: str = "chat.completion"
    mia: Any = None
    """The research agent's trace (model ``mia`` only)."""


class DeltaFunctionCall(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None
    """The next piece of the arguments' JSON text."""


class DeltaToolCall(msgspec.Struct, omit_defaults=True):
    """A piece of a streamed call: its first carries ``id``, ``type`` and ``function.name``, the later ones
    ``function.arguments`` pieces only (OpenAI's stream format)."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning_content: str | None = None
    """The thinking of a reasoning model (split off by its engine's reasoning parser), or the research
    agent's progress, one line per stage."""


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"
    mia: Any = None
    """One research-agent stage event (model ``mia`` only)."""


class ModelObject(msgspec.Struct, omit_defaults=False):
    """One model id, with vLLM's ``ModelCard`` fields (``root``, ``parent``, ``max_model_len``)."""

    id: str
    owned_by: str
    root: str | None
    """A base model's Hugging Face id or folder; an adapter's folder for the admin scope (None for others,
    as ``/v1/adapters`` hides it); ``mia`` for the agent."""
    created: int
    adapter_version: int | None = None
    parent: str | None = None
    """The base model id an adapter or role runs on; None for a base model, the agent and the encoder."""
    max_model_len: int | None = None
    """Context length in tokens of the id's engine (the Planner's for ``mia``); None for the encoder."""
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelObject]
    object: str = "list"
