"""``POST /v1/chat/completions`` for the raw roles: validate, render, generate, encode."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, NamedTuple

import msgspec

from ..config import ServerConfig
from ..engines.client import (CompletionDelta, ContextLengthError, EngineClient, EngineUnavailable,
                              InvalidGeneration, SamplingOptions, TokenLogprob)
from .completion_bodies import CompletionRequest
from .errors import BadRequest, ErrorBody, ErrorDetail, NotFound, Unavailable
from .images import image_param, image_parts, load_images
from .limits import check_prompt_chars
from .metrics import Metrics
from .openai_bodies import (MAX_INT, AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChatMessage,
                            Choice, ChoiceLogprobs, ChunkChoice, Delta, DeltaToolCall, TextPart, TokenLogprobOut,
                            TopLogprobOut, Usage)
from .tool_calls import NO_TOOLS, ToolMode, parse_tool_calls, parsed_tool_calls, tool_mode


class PreparedChat(msgspec.Struct):
    """A validated request, ready for the engine."""

    request: ChatCompletionRequest
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
        self.check_model(request.model)
        if request.n > self.config.max_n:
            raise BadRequest(f"n = {request.n} is more than this server allows ({self.config.max_n}).", param="n")
        if request.top_logprobs is not None and not request.logprobs:
            raise BadRequest("top_logprobs requires logprobs = true.", param="top_logprobs")
        images: list[Any] = []
        if parts := image_parts(request.messages):
            if not self.client.supports_images(request.model):
                raise BadRequest(f"The model `{request.model}` does not take images (its engine serves a text-only "
                                 "model); send images to a vision-language role or to `mia`.",
                                 param=image_param(*parts[0][:2]), code="images_not_supported")
            images = [item.image for item in await load_images(request.messages, self.config.images)]
        tools = tool_mode(request, can_parse=bool(request.tools) and self.client.parses_tool_calls(request.model))
        messages = [with_tool_fields(m, template_message(m) if images else flatten_message(i, m))
                    for i, m in enumerate(request.messages)]
        check_prompt_chars(sum(len(message_text(m)) for m in request.messages),
                           self.client.max_model_len(request.model), "messages", self.config.limits)
        try:
            extra = {"tools": tools.tools} if tools.tools else {}
            prompt_ids = await self.client.render_chat(request.model, messages, **extra)
        except Exception as err:  # chat templates raise on sequences they don't accept
            raise BadRequest(f"The messages do not fit this model's chat template: {err}", param="messages") from None
        try:
            max_tokens = self.client.max_tokens_for(
                request.model, len(prompt_ids), request.max_completion_tokens or request.max_tokens)
        except ContextLengthError as err:
            raise BadRequest(str(err), param="messages", code="context_length_exceeded") from None
        max_tokens = min(max_tokens, self.config.limits.max_tokens)  # a default budget is capped too
        options = _options(request, max_tokens, tools)
        if tools.parses and tools.tools and not self.client.skips_special_tokens(request.model, tools.tools):
            options = msgspec.structs.replace(options, skip_special_tokens=False)
        return PreparedChat(request, prompt_ids, options,
                            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), images, tools)

    def check_model(self, model: str) -> None:
        if not self.client.has_model(model):
            raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
        if not self.client.is_ready():
            raise Unavailable(self.client.not_ready_reason(), code="engine_not_ready")

    async def open(self, chat: PreparedChat, *, stream: bool) -> Generation:
        """Start generating and wait for the first output, so a request the engine refuses still gets a
        proper 4xx/503 rather than a broken stream."""
        return await self.open_prompt(chat.request.model, chat.prompt_ids, chat.options, chat.request_id,
                                      stream=stream, images=chat.images)

    async def open_prompt(self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                          stream: bool, images: list[Any] | None = None) -> Generation:
        """``open`` for a prompt already in token ids (``/v1/completions`` too)."""
        outputs = self._generate(model, prompt_ids, options, request_id, stream=stream, images=images or [])
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
                                             _choice_logprobs(d.logprobs) if d.logprobs is not None else None)
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
        found = await self.client.extract_tool_calls(chat.request.model, text, chat.tools.tools)
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
        logprobs = _choice_logprobs(held.logprobs) if held.logprobs is not None else None
        if isinstance(message.tool_calls, list):
            calls = [DeltaToolCall(i, c.id, c.function) for i, c in enumerate(message.tool_calls)]
            return ChunkChoice(delta.index, Delta(content=message.content or None, tool_calls=calls), reason,
                               logprobs)
        return ChunkChoice(delta.index, Delta(content=message.content or ""), reason, logprobs)

    async def _generate(self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                        stream: bool, images: list[Any]) -> AsyncIterator[list[CompletionDelta]]:
        """The engine's deltas, with the request's metrics recorded whatever the outcome."""
        start = time.perf_counter()
        status, num_tokens, is_first = "cancelled", 0, True
        self.metrics.in_flight.labels(model).inc()
        try:
            extra = {"images": images} if images else {}
            async with aclosing(self.client.generate(model, prompt_ids, options, request_id,
                                                     stream=stream, **extra)) as deltas:
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


def template_message(message: ChatMessage) -> dict[str, Any]:
    """A message for a vision-language chat template: text and ``{"type": "image"}`` parts, in order."""
    content = message.content
    if not isinstance(content, list):
        return {"role": message.role, "content": content or ""}
    parts = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"} for p in content]
    return {"role": message.role, "content": parts}


def message_text(message: ChatMessage) -> str:
    """The text of a message, its image parts left out (the research agent takes the image separately)."""
    content = message.content
    if not isinstance(content, list):
        return content or ""
    return "\n".join(p.text for p in content if isinstance(p, TextPart))


def with_tool_fields(message: ChatMessage, rendered: dict[str, Any]) -> dict[str, Any]:
    """``rendered`` with the message's tool calls (arguments as JSON text) and the call it answers."""
    if message.tool_calls:
        rendered["tool_calls"] = [msgspec.to_builtins(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def flatten_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """Text content only, for a text model (an image part is refused)."""
    content = message.content
    if content is None:
        return {"role": message.role, "content": ""}
    if isinstance(content, str):
        return {"role": message.role, "content": content}
    texts = []
    for part in content:
        if not isinstance(part, TextPart):
            raise BadRequest("This model does not take images.", param=f"messages[{index}].content")
        texts.append(part.text)
    return {"role": message.role, "content": "\n".join(texts)}


def _options(request: ChatCompletionRequest, max_tokens: int, tools: ToolMode) -> SamplingOptions:
    regex, json_schema = (None, tools.schema) if tools.calls_tools else constraint(request)
    return sampling_options(request, max_tokens=max_tokens, regex=regex, json_schema=json_schema,
                            logprobs=(request.top_logprobs or 0) if request.logprobs else None)


def sampling_options(request: ChatCompletionRequest | CompletionRequest, *, max_tokens: int | None,
                     logprobs: int | None, regex: str | None, json_schema: dict | None) -> SamplingOptions:
    """The sampling fields chat and completion requests share, as the engine takes them; the caller decides
    the budget, the log-probs (the two APIs spell them differently) and the constraint."""
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingOptions(
        n=request.n, temperature=request.temperature, top_p=request.top_p, max_tokens=max_tokens, stop=stop,
        seed=request.seed, logprobs=logprobs, presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty, top_k=request.top_k, min_p=request.min_p,
        repetition_penalty=request.repetition_penalty, logit_bias=logit_bias_ids(request.logit_bias),
        min_tokens=request.min_tokens, ignore_eos=request.ignore_eos, regex=regex, json_schema=json_schema,
    )


def logit_bias_ids(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as strings) as vLLM takes it: int keys, values clamped to
    [-100, 100]. An id outside the vocabulary is refused by the engine (also a 400)."""
    if not logit_bias:
        return None
    result = {}
    for key, bias in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise BadRequest(f"logit_bias key {key!r} is not a token id.", param="logit_bias") from None
        if not 0 <= token_id <= MAX_INT:
            raise BadRequest(f"logit_bias key {key!r} is not a token id.", param="logit_bias")
        result[token_id] = min(100.0, max(-100.0, bias))
    return result


def _message(tools: ToolMode, text: str, finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
    """The assistant message of a whole completion, and its finish reason (``tool_calls`` under
    ``required``, ``stop`` for a named function, as OpenAI and vLLM answer)."""
    calls = parse_tool_calls(tools, text) if tools.calls_tools else None
    if calls is None:
        return AssistantMessage(content=text), finish_reason
    reason = "tool_calls" if tools.named is None and finish_reason == "stop" else finish_reason
    return AssistantMessage(content="" if tools.named else None, tool_calls=calls), reason


def constraint(request: ChatCompletionRequest | CompletionRequest) -> tuple[str | None, dict | None]:
    """(regex, JSON schema) from ``structured_outputs`` or ``response_format``; an invalid regex or schema
    is refused by the engine when the request is added (also a 400)."""
    so, fmt = request.structured_outputs, request.response_format
    if so is not None and fmt is not None and fmt.type != "text":
        raise BadRequest("Give either structured_outputs or response_format, not both.", param="response_format")
    if so is not None:
        given = [name for name in ("regex", "json", "choice") if getattr(so, name) is not None]
        if len(given) != 1:
            raise BadRequest("structured_outputs takes exactly one of regex, json, choice.",
                             param="structured_outputs")
        if so.choice is not None:
            return "|".join(re.escape(c) for c in so.choice), None
        if isinstance(so.json, str):
            try:
                schema = msgspec.json.decode(so.json)
            except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
                raise BadRequest("structured_outputs.json is not valid JSON.", param="structured_outputs.json") from None
            if not isinstance(schema, dict):
                raise BadRequest("structured_outputs.json must be a JSON schema object.",
                                 param="structured_outputs.json")
            return None, schema
        return so.regex, so.json
    if fmt is None or fmt.type == "text":
        return None, None
    if fmt.type == "json_object":
        return None, {"type": "object"}
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise BadRequest("response_format of type json_schema needs json_schema.schema.",
                         param="response_format.json_schema")
    return None, fmt.json_schema.schema


LOGPROB_TOKENS_PER_SLICE = 128
"""Tokens whose log-probs are built and encoded between two turns of the event loop (a few milliseconds
with 20 top candidates each)."""


async def encode_with_logprobs(completion: ChatCompletion, logprobs: list[list[TokenLogprob]]) -> list[bytes]:
    """``completion`` encoded in parts with each choice's log-probs (``logprobs[i]`` for ``choices[i]``), slice
    by slice, giving the event loop a turn between slices: n = 16 choices of 4096 tokens with 20 top
    candidates are over a million objects (in a thread they would still hold the GIL), and tens of
    megabytes, which stay in their slices (joined, the copy would hold the loop)."""
    encoded = []
    for choice, choice_logprobs in zip(completion.choices, logprobs):
        head = msgspec.json.encode(msgspec.structs.replace(choice, logprobs=ChoiceLogprobs([])))
        before, found, after = head.partition(b'"logprobs":{"content":[]}')  # strings escape quotes: found once
        assert found, "a choice encodes its log-probs field"
        parts = [before + b'"logprobs":{"content":[']
        for start in range(0, len(choice_logprobs), LOGPROB_TOKENS_PER_SLICE):
            content = _choice_logprobs(choice_logprobs[start:start + LOGPROB_TOKENS_PER_SLICE]).content
            parts.append((b"," if start else b"") + msgspec.json.encode(content)[1:-1])
            await asyncio.sleep(0)
        parts.append(b"]}" + after)
        encoded.append(parts)
    return splice_choices(completion, encoded)


def encode_choices_apart(completion: Any, choices: list[Any]) -> list[bytes]:
    """``completion`` (a struct with a ``choices`` field) encoded in parts with ``choices``, each encoded on
    its own: no single encoder call, and no copy into one buffer, holds the interpreter (and so the event
    loop) for long."""
    return splice_choices(completion, [[msgspec.json.encode(c)] for c in choices])


def splice_choices(completion: Any, encoded: list[list[bytes]]) -> list[bytes]:
    """``completion`` (a struct with a ``choices`` field) encoded in parts, with its choices given already
    encoded, each in parts."""
    head = msgspec.json.encode(msgspec.structs.replace(completion, choices=[]))
    before, found, after = head.partition(b'"choices":[]')  # quotes inside strings are escaped: found once
    assert found, "the completion encodes its choices field"
    parts = [before + b'"choices":[']
    for index, choice in enumerate(encoded):
        if index:
            parts.append(b",")
        parts += choice
    parts.append(b"]" + after)
    return parts


def _choice_logprobs(logprobs: list[TokenLogprob] | None) -> ChoiceLogprobs:
    content = [
        TokenLogprobOut(lp.token, lp.logprob, tuple(lp.token.encode()),
                        [TopLogprobOut(t.token, t.logprob, tuple(t.token.encode())) for t in lp.top])
        for lp in logprobs or []
    ]
    return ChoiceLogprobs(content)


def usage_of(chat: PreparedChat, completion_tokens: int) -> Usage:
    prompt = len(chat.prompt_ids)
    return Usage(prompt, completion_tokens, prompt + completion_tokens)


async def chain(first: list[CompletionDelta], rest: AsyncIterator[list[CompletionDelta]]
                 ) -> AsyncIterator[list[CompletionDelta]]:
    if first:
        yield first
    async for deltas in rest:
        yield deltas


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
