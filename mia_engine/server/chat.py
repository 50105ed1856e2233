"""``POST /v1/chat/completions`` for the raw roles: validate, render, generate, encode."""

from __future__ import annotations

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
from .errors import BadRequest, ErrorBody, ErrorDetail, NotFound, Unavailable
from .images import image_param, image_parts, load_images
from .metrics import Metrics
from .openai_bodies import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChatMessage,
                            Choice, ChoiceLogprobs, ChunkChoice, Delta, TextPart, TokenLogprobOut, TopLogprobOut,
                            Usage)


class PreparedChat(msgspec.Struct):
    """A validated request, ready for the engine."""

    request: ChatCompletionRequest
    prompt_ids: list[int]
    options: SamplingOptions
    request_id: str
    created: int
    images: list[Any] = []
    """Decoded images for the prompt's image placeholders, in order."""


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
        messages = [template_message(m) if images else flatten_message(i, m) for i, m in enumerate(request.messages)]
        try:
            prompt_ids = await self.client.render_chat(request.model, messages)
        except Exception as err:  # chat templates raise on sequences they don't accept
            raise BadRequest(f"The messages do not fit this model's chat template: {err}", param="messages") from None
        try:
            max_tokens = self.client.max_tokens_for(
                request.model, len(prompt_ids), request.max_completion_tokens or request.max_tokens)
        except ContextLengthError as err:
            raise BadRequest(str(err), param="messages", code="context_length_exceeded") from None
        max_tokens = min(max_tokens, self.config.limits.max_tokens)  # a default budget is capped too
        return PreparedChat(request, prompt_ids, _options(request, max_tokens),
                            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), images)

    def check_model(self, model: str) -> None:
        if not self.client.has_model(model):
            raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
        if not self.client.is_ready():
            raise Unavailable(self.client.not_ready_reason(), code="engine_not_ready")

    async def open(self, chat: PreparedChat, *, stream: bool) -> Generation:
        """Start generating and wait for the first output, so a request the engine refuses still gets a
        proper 4xx/503 rather than a broken stream."""
        outputs = self._generate(chat, stream=stream)
        try:
            first = await anext(outputs)
        except StopAsyncIteration:
            first = []
        except InvalidGeneration as err:
            raise BadRequest(f"Invalid sampling parameters: {err}", param=err.param) from None
        except EngineUnavailable as err:
            raise Unavailable(str(err), code="engine_not_ready") from None
        return Generation(first, outputs)

    async def complete(self, chat: PreparedChat, generation: Generation) -> bytes:
        """A whole (non-streamed) completion, encoded."""
        finals = generation.first
        async with aclosing(generation.rest) as rest:
            async for deltas in rest:
                finals = deltas
        want_logprobs = chat.options.logprobs is not None
        choices = [Choice(d.index, AssistantMessage(content=d.text), d.finish_reason,
                          _choice_logprobs(d.logprobs) if want_logprobs else None)
                   for d in sorted(finals, key=lambda d: d.index)]
        usage = usage_of(chat, sum(d.num_tokens for d in finals))
        return msgspec.json.encode(ChatCompletion(chat.request_id, chat.created, chat.request.model, choices, usage))

    async def stream(self, chat: PreparedChat, generation: Generation) -> AsyncIterator[bytes]:
        """Server-sent events: a role chunk, content chunks, an optional usage chunk, ``[DONE]``.

        An engine failure after the first token cannot change the status code any more: it is sent as
        an ``{"error": ...}`` event, as OpenAI and vLLM do."""
        model, encode = chat.request.model, msgspec.json.encode
        first = [ChunkChoice(i, Delta(role="assistant", content="")) for i in range(chat.options.n)]
        yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, first)))
        num_tokens = 0
        async with aclosing(generation.rest) as rest:
            try:
                async for deltas in _chain(generation.first, rest):
                    for d in deltas:
                        num_tokens += d.num_tokens
                        logprobs = _choice_logprobs(d.logprobs) if d.logprobs is not None else None
                        choice = ChunkChoice(d.index, Delta(content=d.text), d.finish_reason, logprobs)
                        yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, [choice])))
            except (InvalidGeneration, EngineUnavailable) as err:
                error = Unavailable(str(err)) if isinstance(err, EngineUnavailable) else BadRequest(str(err))
                yield sse(encode(ErrorBody(ErrorDetail(error.message, error.type, None, error.code))))
        if chat.request.stream_options and chat.request.stream_options.include_usage:
            usage = usage_of(chat, num_tokens)
            yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, [], usage)))
        yield b"data: [DONE]\n\n"

    async def _generate(self, chat: PreparedChat, *, stream: bool) -> AsyncIterator[list[CompletionDelta]]:
        """The engine's deltas, with the request's metrics recorded whatever the outcome."""
        model, start = chat.request.model, time.perf_counter()
        status, num_tokens, is_first = "cancelled", 0, True
        self.metrics.in_flight.labels(model).inc()
        try:
            extra = {"images": chat.images} if chat.images else {}
            async with aclosing(self.client.generate(model, chat.prompt_ids, chat.options, chat.request_id,
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
            self.metrics.prompt_tokens.labels(model).inc(len(chat.prompt_ids))
            self.metrics.completion_tokens.labels(model).inc(num_tokens)
            self.metrics.latency.labels(model).observe(time.perf_counter() - start)


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


def flatten_message(index: int, message: ChatMessage) -> dict[str, str]:
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


def _options(request: ChatCompletionRequest, max_tokens: int) -> SamplingOptions:
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    regex, json_schema = _constraint(request)
    return SamplingOptions(
        n=request.n, temperature=request.temperature, top_p=request.top_p, max_tokens=max_tokens, stop=stop,
        seed=request.seed, logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
        regex=regex, json_schema=json_schema,
    )


def _constraint(request: ChatCompletionRequest) -> tuple[str | None, dict | None]:
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
            except msgspec.DecodeError:
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


def _choice_logprobs(logprobs: list[TokenLogprob] | None) -> ChoiceLogprobs:
    content = [
        TokenLogprobOut(lp.token, lp.logprob, list(lp.token.encode()),
                        [TopLogprobOut(t.token, t.logprob, list(t.token.encode())) for t in lp.top])
        for lp in logprobs or []
    ]
    return ChoiceLogprobs(content)


def usage_of(chat: PreparedChat, completion_tokens: int) -> Usage:
    prompt = len(chat.prompt_ids)
    return Usage(prompt, completion_tokens, prompt + completion_tokens)


async def _chain(first: list[CompletionDelta], rest: AsyncIterator[list[CompletionDelta]]
                 ) -> AsyncIterator[list[CompletionDelta]]:
    if first:
        yield first
    async for deltas in rest:
        yield deltas


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
