"""``POST /v1/completions``: OpenAI's legacy text completions on the raw roles (what ``vllm bench serve``'s
default ``openai`` backend and many scripts call).

A prompt is text (tokenized with the model's tokenizer, special tokens added as vLLM does) or token ids;
a list of prompts runs as concurrent engine requests, choice ``i * n + j`` being prompt ``i``'s ``j``-th
completion. The request takes one admission slot of its model, like a chat request. The research agent
(``mia``) is refused with a 400 naming ``model``: it answers a question in a conversation
(``/v1/chat/completions``), not a text to continue, and echo, log-probs and token-id prompts mean
nothing for it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing
from typing import NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from ..config import AGENT_MODEL, ServerConfig
from ..engines.client import (CompletionDelta, ContextLengthError, EngineClient, EngineUnavailable,
                              InvalidGeneration, RoleClient, SamplingOptions, TokenLogprob)
from .admission import Admission
from .body import decode_body, read_body
from .ignored_fields import warn_ignored
from .chat import ChatService, Generation, capped_budget
from .completion_parts import encode_choices_apart
from .sampling import constraint, sampling_options
from .streaming import chain, sse
from .chat_api import until_disconnect
from .completion_bodies import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from .errors import BadRequest, ErrorBody, ErrorDetail, Unavailable
from .limits import check_logprob_entries, check_max_tokens, check_prompt_chars, check_stop, check_structured
from .metrics import Metrics
from .openai_bodies import MAX_INT, Usage
from .openapi import ApiRoute
from .responses import JSONPartsResponse


def completion_routes(client: EngineClient, config: ServerConfig, admission: Admission, metrics: Metrics, *,
                      has_agent: bool) -> list[BaseRoute]:
    handlers = CompletionHandlers(client, ChatService(client, config, metrics), config, admission,
                                  has_agent=has_agent)
    return [ApiRoute("/v1/completions", handlers.completions, method="POST",
                     summary="Text completion of a prompt by a role (OpenAI's legacy completions)", scope="chat",
                     request_type=CompletionRequest, response_type=Completion)]


class PreparedPrompt(NamedTuple):
    ids: list[int]
    echo: str
    """The prompt's text when ``echo`` is asked for, else empty."""
    options: SamplingOptions


class PreparedCompletion(NamedTuple):
    request: CompletionRequest
    role: RoleClient
    prompts: list[PreparedPrompt]
    request_id: str
    created: int


class CompletionHandlers:
    def __init__(self, client: EngineClient, chat: ChatService, config: ServerConfig, admission: Admission, *,
                 has_agent: bool) -> None:
        self._client = client
        self._chat = chat
        self._config = config
        self._admission = admission
        self._has_agent = has_agent
        self._decoder = msgspec.json.Decoder(CompletionRequest)

    async def completions(self, request: Request) -> Response:
        raw = await read_body(request, self._config.max_body_bytes)
        body: CompletionRequest = decode_body(raw, self._decoder)
        warn_ignored("/v1/completions", raw, CompletionRequest)
        role, prompts = self._check(body)
        key = f"model:{body.model}"
        await self._admission.acquire(key, self._config.admission.max_concurrent_per_model, param="model",
                                      request=request)
        try:
            prepared = await self._prepare(body, role, prompts)
            if body.stream:
                generations = await self._open(prepared, stream=True)
                response: Response = StreamingResponse(
                    self._stream(prepared, generations), media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"})
                return self._admission.held_by(key, response)
            response = await until_disconnect(request, self._complete(prepared))
        except BaseException:
            self._admission.release(key)
            raise
        self._admission.release(key)
        return response

    def _check(self, body: CompletionRequest) -> tuple[RoleClient, list[str | list[int]]]:
        """Everything that refuses a request before it takes a slot; the model's handle and the prompts."""
        if body.model == AGENT_MODEL and self._has_agent:
            raise BadRequest(f"`{AGENT_MODEL}` (the research agent) answers questions on /v1/chat/completions; "
                             "/v1/completions serves the raw roles.", param="model", code="model_not_supported")
        role = self._chat.check_model(body.model)
        limits = self._config.limits
        if body.n > self._config.max_n:
            raise BadRequest(f"n = {body.n} is more than this server allows ({self._config.max_n}).", param="n")
        check_max_tokens("max_tokens", body.max_tokens, limits)
        if body.best_of is not None and body.best_of not in (1, body.n):
            raise BadRequest("best_of other than n is not supported: every sampled sequence is returned.",
                             param="best_of")
        if body.suffix:
            raise BadRequest("suffix (fill in the middle) is not supported by these models.", param="suffix")
        if body.echo and body.logprobs is not None:
            raise BadRequest("echo with logprobs (the prompt's log-probs) is not supported.", param="echo")
        prompts = _prompts(body.prompt)
        choices = len(prompts) * body.n
        if choices > limits.max_completion_choices:
            raise BadRequest(f"{choices} choices (prompts x n) in one request; this server takes at most "
                             f"{limits.max_completion_choices} (server.limits.max_completion_choices).", param="prompt",
                             code="limit_exceeded")
        for index, prompt in enumerate(prompts):  # each prompt's size, before any is tokenised
            if isinstance(prompt, str):
                check_prompt_chars(len(prompt), role.max_model_len(), _param(body, index), limits)
            else:
                _budget(role, len(prompt), body.max_tokens, _param(body, index))
        requested = body.max_tokens or limits.max_tokens
        check_logprob_entries("logprobs", choices * requested if requested else None, body.logprobs, limits)
        check_stop(body.stop, limits)
        check_structured(body, limits, role.vocab_size())
        return role, prompts

    async def _prepare(self, body: CompletionRequest, role: RoleClient, texts: list[str | list[int]]
                       ) -> PreparedCompletion:
        """The prompts in token ids, each with its budget (``_check`` has bounded their sizes)."""
        options = _options(body)
        prompts = []
        for index, prompt in enumerate(texts):
            param = _param(body, index)
            if isinstance(prompt, str):
                ids = await role.tokenize(prompt, add_special_tokens=body.add_special_tokens)
                echo = prompt if body.echo else ""
            else:
                ids = prompt
                echo = await _detokenize(role, ids, param) if body.echo else ""
            if not ids:
                raise BadRequest("The prompt is empty.", param=param)
            max_tokens = capped_budget(_budget(role, len(ids), body.max_tokens, param), self._config.limits.max_tokens)
            prompts.append(PreparedPrompt(ids, echo, msgspec.structs.replace(options, max_tokens=max_tokens)))
        # a budget the request did not give is known only now
        check_logprob_entries("logprobs", body.n * sum(p.options.max_tokens or 0 for p in prompts), body.logprobs,
                              self._config.limits)
        return PreparedCompletion(body, role, prompts, f"cmpl-{uuid.uuid4().hex}", int(time.time()))

    async def _open(self, prepared: PreparedCompletion, *, stream: bool) -> list[Generation]:
        """Start every prompt's generation at once; if one is refused, close the others and raise."""
        opened = await asyncio.gather(*(
            self._chat.open_prompt(prepared.role, p.ids, p.options, f"{prepared.request_id}-{i}", stream=stream)
            for i, p in enumerate(prepared.prompts)), return_exceptions=True)
        failure = next((g for g in opened if isinstance(g, BaseException)), None)
        if failure is not None:
            for generation in opened:
                if isinstance(generation, Generation):
                    await generation.rest.aclose()  # type: ignore[attr-defined]
            raise failure
        return opened  # type: ignore[return-value]

    async def _complete(self, prepared: PreparedCompletion) -> Response:
        generations = await self._open(prepared, stream=False)
        n, numbered, num_generated = prepared.request.n, [], 0
        for number, (prompt, generation) in enumerate(zip(prepared.prompts, generations)):
            finals = generation.first
            async with aclosing(generation.rest) as rest:
                async for deltas in rest:
                    finals = deltas
            for d in sorted(finals, key=lambda d: d.index):
                num_generated += d.num_tokens
                numbered.append((number * n + d.index, prompt.echo, d))
        usage = _usage(prepared, num_generated)
        completion = Completion(prepared.request_id, prepared.created, prepared.request.model, [], usage)
        num_logprobs = prepared.request.logprobs
        if num_logprobs is None:
            completion.choices = [_choice(index, echo, d, None) for index, echo, d in numbered]
            return Response(msgspec.json.encode(completion), media_type="application/json")
        encoded = await asyncio.to_thread(  # many log-prob objects: built and encoded off the event loop
            lambda: encode_choices_apart(completion, [_choice(i, e, d, num_logprobs) for i, e, d in numbered]))
        return JSONPartsResponse(encoded)

    async def _stream(self, prepared: PreparedCompletion, generations: list[Generation]) -> AsyncIterator[bytes]:
        """Server-sent events, prompt after prompt (all generate at once); an engine failure after the first
        chunk is an ``{"error": ...}`` event; then the usage chunk if asked, and ``[DONE]``."""
        body, encode = prepared.request, msgspec.json.encode
        num_generated = 0
        async with AsyncExitStack() as stack:
            rests = [await stack.enter_async_context(aclosing(g.rest)) for g in generations]
            try:
                for number, (prompt, generation, rest) in enumerate(zip(prepared.prompts, generations, rests)):
                    offsets = [len(prompt.echo)] * body.n
                    if prompt.echo:
                        echoes = [CompletionChoice(number * body.n + j, prompt.echo, None) for j in range(body.n)]
                        yield sse(encode(self._chunk(prepared, echoes)))
                    async for deltas in chain(generation.first, rest):
                        choices = []
                        for d in deltas:
                            num_generated += d.num_tokens
                            choices.append(_choice(number * body.n + d.index, "", d, body.logprobs,
                                                   offsets[d.index]))
                            offsets[d.index] += len(d.text)
                        yield sse(encode(self._chunk(prepared, choices)))
            except (InvalidGeneration, EngineUnavailable) as err:
                error = Unavailable(str(err)) if isinstance(err, EngineUnavailable) else BadRequest(str(err))
                yield sse(encode(ErrorBody(ErrorDetail(error.message, error.type, None, error.code))))
        if body.stream_options and body.stream_options.include_usage:
            yield sse(encode(self._chunk(prepared, [], _usage(prepared, num_generated))))
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _chunk(prepared: PreparedCompletion, choices: list[CompletionChoice], usage: Usage | None = None
               ) -> Completion:
        return Completion(prepared.request_id, prepared.created, prepared.request.model, choices, usage)


def _prompts(prompt: str | list) -> list[str | list[int]]:
    """The prompt as a list of texts or token-id lists (vLLM's four shapes); anything else is a 400."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(_is_token_id(t) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise BadRequest("prompt must be a string, a list of strings, a list of token ids, or a list of non-empty "
                     "token-id lists.", param="prompt")


def _param(body: CompletionRequest, index: int) -> str:
    """The field of the request's ``index``-th prompt: ``prompt`` for a single text or token-id list."""
    single = isinstance(body.prompt, str) or not isinstance(body.prompt[0], (str, list))
    return "prompt" if single else f"prompt[{index}]"


def _budget(role: RoleClient, num_prompt_tokens: int, requested: int | None, param: str) -> int:
    """``role.max_tokens_for``, its ``ContextLengthError`` a 400 naming ``param``."""
    try:
        return role.max_tokens_for(num_prompt_tokens, requested)
    except ContextLengthError as err:
        raise BadRequest(str(err), param=param, code="context_length_exceeded") from None


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _options(body: CompletionRequest) -> SamplingOptions:
    regex, json_schema = constraint(body)
    return sampling_options(body, max_tokens=None, logprobs=body.logprobs, regex=regex, json_schema=json_schema)


def _choice(index: int, echo: str, delta: CompletionDelta, num_logprobs: int | None, offset: int | None = None
            ) -> CompletionChoice:
    logprobs = None
    if num_logprobs is not None:
        logprobs = _legacy_logprobs(delta.logprobs or [], len(echo) if offset is None else offset)
    return CompletionChoice(index, echo + delta.text, delta.finish_reason, logprobs)


def _legacy_logprobs(logprobs: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """The legacy API's parallel lists: tokens, their log-probs, the top candidates, character offsets."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in logprobs:
        tokens.append(lp.token)
        values.append(lp.logprob)
        tops.append({t.token: t.logprob for t in lp.top})
        offsets.append(offset)
        offset += len(lp.token)
    return CompletionLogprobs(tokens, values, tops, offsets)


def _usage(prepared: PreparedCompletion, completion_tokens: int) -> Usage:
    prompt_tokens = sum(len(p.ids) for p in prepared.prompts)
    return Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


async def _detokenize(role: RoleClient, ids: list[int], param: str) -> str:
    try:
        return await role.detokenize(ids)
    except ValueError as err:
        raise BadRequest(f"The prompt's {err}.", param=param) from None
