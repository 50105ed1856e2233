"""``POST /v1/chat/completions``: a raw role (``chat.py: ChatService``) or, for model ``mia``, the research
agent (``agent_api.py: AgentChat``).

The whole request is checked (body cap, limits, the model, the key's scope for it: ``agent`` for ``mia``,
``chat`` for a role, and ``learn`` for ``learn: true``, which is audited) before it takes an admission slot of
its model (a role) or of the research route (``mia``). A non-streamed answer is cancelled, with its engine
requests, if the client goes away first; a stream keeps its slot until it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from ..agent.loop import ResearchRequest
from ..config import AGENT_MODEL, ServerConfig
from ..engines.client import EngineClient
from .admission import Admission
from .agent_api import AgentChat, AgentSource
from .body import decode_body, read_body
from .chat import ChatService, PreparedChat, refuse_raw_only_fields
from .ignored_fields import warn_ignored
from .limits import check_chat_limits
from .metrics import Metrics
from .openai_bodies import ChatCompletion, ChatCompletionRequest
from .openapi import ApiRoute
from .responses import JSONPartsResponse
from .security import audit, require_scope


def chat_routes(client: EngineClient, config: ServerConfig, admission: Admission, metrics: Metrics,
                agent: AgentSource | None = None) -> list[BaseRoute]:
    """Without an ``agent``, ``mia`` is a model like any other the engines do not serve (404)."""
    agent_chat = AgentChat(agent, config, metrics) if agent is not None else None
    handlers = ChatHandlers(ChatService(client, config, metrics), agent_chat, config, admission)
    return [
        ApiRoute("/v1/chat/completions", handlers.chat_completions, method="POST",
                 summary="Chat completion of a role, or a research answer (model `mia`)",
                 scope=("chat", "agent"), request_type=ChatCompletionRequest, response_type=ChatCompletion),
    ]


class ChatHandlers:
    def __init__(self, chat: ChatService, agent_chat: AgentChat | None, config: ServerConfig,
                 admission: Admission) -> None:
        self._chat = chat
        self._agent_chat = agent_chat
        self._config = config
        self._admission = admission
        self._decoder = msgspec.json.Decoder(ChatCompletionRequest)

    async def chat_completions(self, request: Request) -> Response:
        config = self._config
        raw = await read_body(request, config.max_body_bytes)
        body: ChatCompletionRequest = decode_body(raw, self._decoder)
        warn_ignored("/v1/chat/completions", raw, ChatCompletionRequest)
        check_chat_limits(body, config.limits, self._chat.vocab_size(body.model))
        is_research = body.model == AGENT_MODEL and self._agent_chat is not None
        require_scope(request, "agent" if is_research else "chat", f"Model `{body.model}`", param="model")
        if body.learn:
            require_scope(request, "learn", "Learning from a request (learn: true)", param="learn")
            audit(request, f"learn: true on model `{body.model}`", "requested")
        if is_research:
            refuse_raw_only_fields(body)
            return await self._admitted(request, body, f"route:{AGENT_MODEL}",
                                        config.admission.max_concurrent_research, self._research)
        self._chat.check_model(body.model)
        return await self._admitted(request, body, f"model:{body.model}", config.admission.max_concurrent_per_model,
                                    self._generate)

    async def _admitted(self, request: Request, body: ChatCompletionRequest, key: str, limit: int,
                        handler: Callable[[Request, ChatCompletionRequest], Awaitable[Response]]) -> Response:
        """Run ``handler`` in a slot of ``key``; a stream keeps its slot until it ends."""
        await self._admission.acquire(key, limit, param="model", request=request)
        try:
            response = await handler(request, body)
        except BaseException:
            self._admission.release(key)
            raise
        if isinstance(response, StreamingResponse):
            return self._admission.held_by(key, response)
        self._admission.release(key)
        return response

    async def _generate(self, request: Request, body: ChatCompletionRequest) -> Response:
        chat = self._chat
        prepared = await chat.prepare(body)
        if prepared.request.stream:
            generation = await chat.open(prepared, stream=True)
            return StreamingResponse(chat.stream(prepared, generation), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await until_disconnect(request, self._complete(prepared))

    async def _research(self, request: Request, body: ChatCompletionRequest) -> Response:
        agent_chat = self._agent_chat
        assert agent_chat is not None
        research_request = await agent_chat.research_request(body)
        await agent_chat.check_fits(research_request)
        if body.stream:
            return StreamingResponse(agent_chat.stream(body, research_request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await until_disconnect(request, self._research_answer(body, research_request))

    async def _research_answer(self, body: ChatCompletionRequest, research_request: ResearchRequest) -> Response:
        assert self._agent_chat is not None
        return Response(await self._agent_chat.complete(body, research_request), media_type="application/json")

    async def _complete(self, prepared: PreparedChat) -> Response:
        generation = await self._chat.open(prepared, stream=False)
        return JSONPartsResponse(await self._chat.complete(prepared, generation))


async def until_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Run ``work``, cancelling it (and so its engine requests) if the client goes away first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        return Response(status_code=499)
    return task.result()
