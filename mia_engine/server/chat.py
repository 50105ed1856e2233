"""``POST /v1/chat/completions`` for the raw roles: validate, render, generate, encode."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, NamedTuple

import msgspec

from ..config import ServerConfig
from ..engines.client import (CompletionDelta, ContextLengthError, EngineClient, EngineUnavailable,
                              InvalidGeneration, RoleClient, SamplingOptions)
from .chat_messages import flatten_message, message_text, template_message, with_tool_fields
from .completion_parts import choice_logprobs_out, encode_with_logprobs
from .errors import BadRequest, ErrorBody, ErrorDetail, NotFound, Unavailable
from .images import image_param, image_parts, load_images
from .limits import check_prompt_chars
from .metrics import Metrics
from .openai_bodies import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice,
                            ChunkChoice, Delta, DeltaToolCall, Usage)
from .sampling import constraint, sampling_options
from .streaming import chain, sse
from .tool_calls import NO_TOOLS, ToolMode, parse_tool_calls, parsed_tool_calls, tool_mode


class PreparedChat(msgspec.Struct):
    """A validated request, ready for the engine."""

    request: ChatCompletionRequest
    role: RoleClient
    """The model id the request names."""
    prompt_ids: list[int]
    options: SamplingOptions
    request_id: str
    created: int
    images: list[Any] = []
    """Decoded images for the prompt's image placeholders, in order."""
    tools: ToolMode = NO_TOOLS
    """The request's tools and how its completion becomes tool calls."""


class Generation(NamedTuple):
    """A started generation: its first output (already received) and the rest of the stream."""

    first: list[CompletionDelta]
    rest: AsyncIterator[list[CompletionDelta]]


class ChatService:
    def __init__(self, client: EngineClient, config: ServerConfig, metrics: Metrics) -> None:
        self.client = client
        self.config = config
        self.metrics = metrics

    async def prepare(self, request: ChatCompletionRequest) -> PreparedChat:
        """Everything that can reject a request, before any engine work starts."""
        role = self.check_model(request.model)
        if request.n > self.config.max_n:
            raise BadRequest(f"n = {request.n} is more than this server allows ({self.config.max_n}).", param="n")
        if request.top_logprobs is not None and not request.logprobs:
            raise BadRequest("top_logprobs requires logprobs = true.", param="top_logprobs")
        images = await self._images(request, role)
        tools = tool_mode(request, can_parse=bool(request.tools) and role.parses_tool_calls())
        prompt_ids = await self._render(request, role, images, tools)
        options = _options(request, self._max_tokens(request, role, len(prompt_ids)), tools)
        if tools.parses and tools.tools and not role.skips_special_tokens(tools.tools):
            options = msgspec.structs.replace(options, skip_special_tokens=False)
        return PreparedChat(request, role, prompt_ids, options,
                            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), images, tools)

    async def _images(self, request: ChatCompletionRequest, role: RoleClient) -> list[Any]:
        """The request's decoded images (none for a text-only request; refused by a text model)."""
        if not (parts := image_parts(request.messages)):
            return []
        if not role.supports_images():
            raise BadRequest(f"The model `{request.model}` does not take images (its engine serves a text-only "
                             "model); send images to a vision-language role or to `mia`.",
                             param=image_param(*parts[0][:2]), code="images_not_supported")
        return [item.image for item in await load_images(request.messages, self.config.images)]

    async def _render(self, request: ChatCompletionRequest, role: RoleClient, images: list[Any],
                      tools: ToolMode) -> list[int]:
        """The prompt's token ids, by the model's chat template."""
        messages = [with_tool_fields(m, template_message(m) if images else flatten_message(i, m))
                    for i, m in enumerate(request.messages)]
        check_prompt_chars(sum(len(message_text(m)) for m in request.messages),
                           role.max_model_len(), "messages", self.config.limits)
        try:
            extra = {"tools": tools.tools} if tools.tools else {}
            return await role.render_chat(messages, **extra)
        except Exception as err:  # chat templates raise on sequences they don't accept
            raise BadRequest(f"The messages do not fit this model's chat template: {err}", param="messages") from None

    def _max_tokens(self, request: ChatCompletionRequest, role: RoleClient, num_prompt_tokens: int) -> int:
        """The completion's budget: what the request asks (else what the context leaves), capped."""
        try:
            max_tokens = role.max_tokens_for(num_prompt_tokens, request.max_completion_tokens or request.max_tokens)
        except ContextLengthError as err:
            raise BadRequest(str(err), param="messages", code="context_length_exceeded") from None
        return min(max_tokens, self.config.limits.max_tokens)  # a default budget is capped too

    def vocab_size(self, model: str) -> int:
        """The vocabulary of ``model``'s engine in tokens; 0 for a model id not served (yet)."""
        role = self.client.find(model)
        return role.vocab_size() if role is not None else 0

    def check_model(self, model: str) -> RoleClient:
        """The handle of ``model``: 404 where no such model is configured, 503 until the engines are up."""
        if not self.client.has_model(model):
            raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
        role = self.client.find(model) if self.client.is_ready() else None
        if role is None:
            raise Unavailable(self.client.not_ready_reason(), code="engine_not_ready")
        return role

    async def open(self, chat: PreparedChat, *, stream: bool) -> Generation:
        """Start generating and wait for the first output, so a request the engine refuses still gets a
        proper 4xx/503 rather than a broken stream."""
        return await self.open_prompt(chat.role, chat.prompt_ids, chat.options, chat.request_id,
                                      stream=stream, images=chat.images)

    async def open_prompt(self, role: RoleClient, prompt_ids: list[int], options: SamplingOptions, request_id: str,
                          *, stream: bool, images: list[Any] | None = None) -> Generation:
        """``open`` for a prompt already in token ids (``/v1/completions`` too)."""
        outputs = self._generate(role, prompt_ids, options, request_id, stream=stream, images=images or [])
        try:
            first = await anext(outputs)
        except StopAsyncIteration:
            first = []
        except InvalidGeneration as err:
            raise BadRequest(f"Invalid sampling parameters: {err}", param=err.param) from None
        except EngineUnavailable as err:
            raise Unavailable(str(err), code="engine_not_ready") from None
        return Generation(first, outputs)

    async def complete(self, chat: PreparedChat, generation: Generation) -> list[bytes]:
        """A whole (non-streamed) completion, encoded in parts (a ``JSONPartsResponse``'s body)."""
        finals = generation.first
        async with aclosing(generation.rest) as rest:
            async for deltas in rest:
                finals = deltas
        finals = sorted(finals, key=lambda d: d.index)
        choices = [Choice(d.index, *await self._answer(chat, d.text, d.finish_reason)) for d in finals]
        usage = usage_of(chat, sum(d.num_tokens for d in finals))
        completion = ChatCompletion(chat.request_id, chat.created, chat.request.model, choices, usage)
        if chat.options.logprobs is None:
            return [msgspec.json.encode(completion)]
        return await encode_with_logprobs(completion, [d.logprobs or [] for d in finals])

    async def stream(self, chat: PreparedChat, generation: Generation) -> AsyncIterator[bytes]:
        """Server-sent events: a role chunk, content chunks, an optional usage chunk, ``[DONE]``. Under
        ``tool_choice`` ``required``, a named function or ``auto``, a completion is held back and sent whole
        in its last chunk, as ``tool_calls`` when it holds calls, else as content (``auto``'s parser reads the
        finished text only).

        An engine failure after the first token cannot change the status code any more: it is sent as
        an ``{"error": ...}`` event, as OpenAI and vLLM do."""
        model, encode = chat.request.model, msgspec.json.encode
        first = [ChunkChoice(i, Delta(role="assistant", content="")) for i in range(chat.options.n)]
        yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, first)))
        num_tokens = 0
        held = [CompletionDelta(i, "", 0, [] if chat.options.logprobs is not None else None)
                for i in range(chat.options.n)]
        async with aclosing(generation.rest) as rest:
            try:
                async for deltas in chain(generation.first, rest):
                    for d in deltas:
                        num_tokens += d.num_tokens
                        choice = await self._tool_chunk(chat, held[d.index], d) if chat.tools.is_read_whole \
                            else ChunkChoice(d.index, Delta(content=d.text), d.finish_reason,
                                             choice_logprobs_out(d.logprobs) if d.logprobs is not None else None)
                        if choice is not None:
                            yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, [choice])))
            except (InvalidGeneration, EngineUnavailable) as err:
                error = Unavailable(str(err)) if isinstance(err, EngineUnavailable) else BadRequest(str(err))
                yield sse(encode(ErrorBody(ErrorDetail(error.message, error.type, None, error.code))))
        if chat.request.stream_options and chat.request.stream_options.include_usage:
            usage = usage_of(chat, num_tokens)
            yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, [], usage)))
        yield b"data: [DONE]\n\n"

    async def _answer(self, chat: PreparedChat, text: str,
                      finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
        """The assistant message of a whole completion and its finish reason: under ``auto`` the engine's
        tool-call parser reads the calls (``tool_calls`` when it found some, as vLLM answers)."""
        if not chat.tools.parses or not chat.tools.tools:
            return _message(chat.tools, text, finish_reason)
        found = await chat.role.extract_tool_calls(text, chat.tools.tools)
        calls = parsed_tool_calls(found, chat.request.parallel_tool_calls)
        if calls is None:
            return AssistantMessage(content=found.content), finish_reason
        return AssistantMessage(content=found.content, tool_calls=calls), "tool_calls"

    async def _tool_chunk(self, chat: PreparedChat, held: CompletionDelta,
                          delta: CompletionDelta) -> ChunkChoice | None:
        """A completion read whole (``ToolMode.is_read_whole``) is sent in one chunk when it ends: ``delta``
        is added to ``held`` (its text and log-probs so far) and the chunk comes with the last one (None
        before)."""
        held.text += delta.text
        if held.logprobs is not None:
            held.logprobs += delta.logprobs or []
        if delta.finish_reason is None:
            return None
        message, reason = await self._answer(chat, held.text, delta.finish_reason)
        logprobs = choice_logprobs_out(held.logprobs) if held.logprobs is not None else None
        if isinstance(message.tool_calls, list):
            calls = [DeltaToolCall(i, c.id, c.function) for i, c in enumerate(message.tool_calls)]
            return ChunkChoice(delta.index, Delta(content=message.content or None, tool_calls=calls), reason,
                               logprobs)
        return ChunkChoice(delta.index, Delta(content=message.content or ""), reason, logprobs)

    async def _generate(self, role: RoleClient, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                        stream: bool, images: list[Any]) -> AsyncIterator[list[CompletionDelta]]:
        """The engine's deltas, with the request's metrics recorded whatever the outcome."""
        model = role.name
        start = time.perf_counter()
        status, num_tokens, is_first = "cancelled", 0, True
        self.metrics.in_flight.labels(model).inc()
        try:
            extra = {"images": images} if images else {}
            async with aclosing(role.generate(prompt_ids, options, request_id, stream=stream, **extra)) as deltas:
                async for batch in deltas:
                    if is_first:
                        self.metrics.first_token.labels(model).observe(time.perf_counter() - start)
                        is_first = False
                    num_tokens += sum(d.num_tokens for d in batch)
                    yield batch
            status = "ok"
        except Exception:
            status = "error"
            raise
        finally:
            self.metrics.in_flight.labels(model).dec()
            self.metrics.requests.labels(model, status).inc()
            self.metrics.prompt_tokens.labels(model).inc(len(prompt_ids))
            self.metrics.completion_tokens.labels(model).inc(num_tokens)
            self.metrics.latency.labels(model).observe(time.perf_counter() - start)


_RAW_ONLY_FIELDS = ("tools", "tool_choice", "functions", "function_call", "logit_bias", "top_k", "min_p",
                    "repetition_penalty")


def refuse_raw_only_fields(request: ChatCompletionRequest) -> None:
    """The research agent (model ``mia``) runs its own tools and samples its roles with its own settings: a
    field that only a raw role honours is refused rather than ignored."""
    for name in _RAW_ONLY_FIELDS:
        if getattr(request, name) is not None:
            raise BadRequest(f"`{name}` applies to the raw roles, not to the research agent `{request.model}` "
                             "(it runs its own tools and sampling).", param=name)
    if request.min_tokens or request.ignore_eos:
        param = "min_tokens" if request.min_tokens else "ignore_eos"
        raise BadRequest(f"`{param}` applies to the raw roles, not to the research agent `{request.model}`.",
                         param=param)


def _options(request: ChatCompletionRequest, max_tokens: int, tools: ToolMode) -> SamplingOptions:
    regex, json_schema = (None, tools.schema) if tools.calls_tools else constraint(request)
    return sampling_options(request, max_tokens=max_tokens, regex=regex, json_schema=json_schema,
                            logprobs=(request.top_logprobs or 0) if request.logprobs else None)


def _message(tools: ToolMode, text: str, finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
    """The assistant message of a whole completion, and its finish reason (``tool_calls`` under
    ``required``, ``stop`` for a named function, as OpenAI and vLLM answer)."""
    calls = parse_tool_calls(tools, text) if tools.calls_tools else None
    if calls is None:
        return AssistantMessage(content=text), finish_reason
    reason = "tool_calls" if tools.named is None and finish_reason == "stop" else finish_reason
    return AssistantMessage(content="" if tools.named else None, tool_calls=calls), reason


def usage_of(chat: PreparedChat, completion_tokens: int) -> Usage:
    prompt = len(chat.prompt_ids)
    return Usage(prompt, completion_tokens, prompt + completion_tokens)
