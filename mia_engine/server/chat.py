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
                              ChoiceReader, InvalidGeneration, ModelUnloaded, OutputReader, OutputReading, RoleClient,
                              SamplingOptions)
from .chat_messages import flatten_message, template_message, with_tool_fields
from .completion_parts import choice_logprobs_out, encode_with_logprobs
from .errors import BadRequest, ErrorBody, ErrorDetail, NotFound, Unavailable
from .images import image_param, image_parts, load_images
from .limits import chat_logprobs_param, chat_prompt_chars, check_logprob_entries, check_prompt_chars
from .metrics import Metrics
from .openai_bodies import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice,
                            ChunkChoice, Delta, Usage)
from .sampling import constraint, sampling_options
from .streaming import chain, sse
from .template_kwargs import template_kwargs_of
from .tool_calls import NO_TOOLS, ToolMode, answer_message, delta_tool_calls, tool_mode


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
    reader: OutputReader | None = None
    """How its completions are read (the engine's reasoning and tool-call parsers, forced calls); None:
    they are all content."""


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
        template_kwargs = template_kwargs_of(request)
        tools = tool_mode(request, can_parse=bool(request.tools) and role.parses_tool_calls())
        check_prompt_chars(chat_prompt_chars(request), role.max_model_len(), "messages", self.config.limits)
        images = await self._images(request, role)  # the first work: images are read and decoded
        prompt_ids = await self._render(request, role, images, tools, template_kwargs)
        reader = role.output_reader(OutputReading(prompt_ids, template_kwargs or {}, tools.tools, tools.calls,
                                                  tools.named or ""))
        options = msgspec.structs.replace(
            _options(request, self._max_tokens(request, role, len(prompt_ids)), tools),
            skip_special_tokens=reader is None or reader.skip_special_tokens,
            reasoning_ended=reader is None or not reader.reads_reasoning, chat_template_kwargs=template_kwargs)
        return PreparedChat(request, role, prompt_ids, options,
                            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), images, tools, reader)

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
                      tools: ToolMode, template_kwargs: dict[str, Any] | None) -> list[int]:
        """The prompt's token ids, by the model's chat template (with the request's template variables)."""
        messages = [with_tool_fields(m, template_message(m) if images else flatten_message(i, m))
                    for i, m in enumerate(request.messages)]
        try:
            extra: dict[str, Any] = {"tools": tools.tools} if tools.tools else {}
            if template_kwargs:
                extra["chat_template_kwargs"] = template_kwargs
            return await role.render_chat(messages, **extra)
        except Exception as err:  # chat templates raise on sequences they don't accept
            raise BadRequest(f"The messages do not fit this model's chat template: {err}", param="messages") from None

    def _max_tokens(self, request: ChatCompletionRequest, role: RoleClient, num_prompt_tokens: int) -> int:
        """The completion's budget: what the request asks, else the role's ``sampling.max_tokens`` or what the
        context leaves (as vLLM), capped by ``server.limits.max_tokens`` where the operator set one; refused
        where its log-probs would pass ``server.limits.max_logprob_entries``."""
        try:
            max_tokens = role.max_tokens_for(num_prompt_tokens, request.max_completion_tokens or request.max_tokens)
        except ContextLengthError as err:
            raise BadRequest(str(err), param="messages", code="context_length_exceeded") from None
        max_tokens = capped_budget(max_tokens, self.config.limits.max_tokens)
        if request.logprobs:  # a budget the request did not give is known only now
            check_logprob_entries(chat_logprobs_param(request), request.n * max_tokens, request.top_logprobs or 0,
                                  self.config.limits)
        return max_tokens

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
        except ModelUnloaded as err:  # unloaded between the request's model check and its start
            raise NotFound(str(err), param="model", code="model_not_found") from None
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
        choices = [Choice(d.index, *await self._answer(chat, d)) for d in finals]
        usage = usage_of(chat, sum(d.num_tokens for d in finals))
        completion = ChatCompletion(chat.request_id, chat.created, chat.request.model, choices, usage)
        if chat.options.logprobs is None:
            return [msgspec.json.encode(completion)]
        return await encode_with_logprobs(completion, [d.logprobs or [] for d in finals])

    async def stream(self, chat: PreparedChat, generation: Generation) -> AsyncIterator[bytes]:
        """Server-sent events: a role chunk, a chunk per engine output (its thinking as
        ``reasoning_content``, its content, the pieces of its calls as ``tool_calls``: a call's id and name,
        then its arguments as they are generated), an optional usage chunk, ``[DONE]``.

        An engine failure after the first token cannot change the status code any more: it is sent as
        an ``{"error": ...}`` event, as OpenAI and vLLM do."""
        model, encode = chat.request.model, msgspec.json.encode
        first = [ChunkChoice(i, Delta(role="assistant", content="")) for i in range(chat.options.n)]
        yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, first)))
        num_tokens = 0
        choices = [_StreamedChoice(chat.reader.choice() if chat.reader is not None else None)
                   for _ in range(chat.options.n)]
        async with aclosing(generation.rest) as rest:
            try:
                async for deltas in chain(generation.first, rest):
                    for d in deltas:
                        num_tokens += d.num_tokens
                        choice = choices[d.index].chunk(chat, d)
                        if choice is not None:
                            yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, [choice])))
            except (InvalidGeneration, EngineUnavailable) as err:
                error = Unavailable(str(err)) if isinstance(err, EngineUnavailable) else BadRequest(str(err))
                yield sse(encode(ErrorBody(ErrorDetail(error.message, error.type, None, error.code))))
        if chat.request.stream_options and chat.request.stream_options.include_usage:
            usage = usage_of(chat, num_tokens)
            yield sse(encode(ChatCompletionChunk(chat.request_id, chat.created, model, [], usage)))
        yield b"data: [DONE]\n\n"

    async def _answer(self, chat: PreparedChat, delta: CompletionDelta) -> tuple[AssistantMessage, str | None]:
        """The assistant message of a whole completion and its finish reason, read by its engine's parsers
        (the thinking, ``auto``'s calls, forced calls) where there is anything to read."""
        if chat.reader is None:
            return AssistantMessage(content=delta.text), delta.finish_reason
        parsed = await chat.reader.choice().whole(delta.text, delta.token_ids)
        return answer_message(chat.tools, parsed, delta.finish_reason, chat.request.parallel_tool_calls)

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
                    "repetition_penalty", "chat_template_kwargs", "chat_template")


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


class _StreamedChoice:
    """One of a stream's ``n`` completions: its reader (None: all content) and whether it sent calls."""

    def __init__(self, reader: ChoiceReader | None) -> None:
        self._reader = reader
        self._sent_calls = False

    def chunk(self, chat: PreparedChat, delta: CompletionDelta) -> ChunkChoice | None:
        """The chunk of the completion's next output; None when it has nothing to send yet (a parser holding
        back a tag it has not read whole) and no log-probs or finish reason either."""
        logprobs = choice_logprobs_out(delta.logprobs) if delta.logprobs is not None else None
        if self._reader is None:
            return ChunkChoice(delta.index, Delta(content=delta.text), delta.finish_reason, logprobs)
        piece = self._reader.delta(delta.text, delta.token_ids, finished=delta.finish_reason is not None)
        out = None
        if piece is not None:
            calls = delta_tool_calls(piece.tool_calls, chat.request.parallel_tool_calls)
            self._sent_calls = self._sent_calls or calls is not None
            if piece.reasoning is not None or piece.content is not None or calls is not None:
                out = Delta(content=piece.content, tool_calls=calls, reasoning_content=piece.reasoning)
        if out is None and delta.finish_reason is None and logprobs is None:
            return None
        reason = delta.finish_reason
        if reason == "stop" and self._sent_calls and chat.tools.named is None:
            reason = "tool_calls"  # as vLLM: "stop" for a named function
        return ChunkChoice(delta.index, out or Delta(), reason, logprobs)


def capped_budget(max_tokens: int, cap: int) -> int:
    """A completion's budget under ``server.limits.max_tokens`` (0: no cap beyond the context)."""
    return min(max_tokens, cap) if cap else max_tokens


def _options(request: ChatCompletionRequest, max_tokens: int, tools: ToolMode) -> SamplingOptions:
    regex, json_schema = (None, tools.schema) if tools.calls_tools else constraint(request)
    return sampling_options(request, max_tokens=max_tokens, regex=regex, json_schema=json_schema,
                            logprobs=(request.top_logprobs or 0) if request.logprobs else None)


def usage_of(chat: PreparedChat, completion_tokens: int) -> Usage:
    prompt = len(chat.prompt_ids)
    return Usage(prompt, completion_tokens, prompt + completion_tokens)
