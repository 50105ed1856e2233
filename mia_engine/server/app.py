"""The Starlette app: routes, API-key check, OpenAI-style errors, engine start in the background.

The server listens at once; the engines start behind it, and until they are up every generation
request (and ``/health``) answers 503, so clients and orchestrators can wait for readiness.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import ServerConfig
from ..engines.protocol import EngineClient, ModelCard
from .agent_api import AgentChat, AgentSource
from .chat import AGENT_MODEL, ChatService
from .errors import APIError, NotFound, PayloadTooLarge, Unauthorized, Unavailable
from .metrics import Metrics
from .protocol import ChatCompletionRequest, ModelList, ModelObject

log = logging.getLogger(__name__)


class Readiness(Protocol):
    def is_ready(self) -> bool: ...

    def not_ready_reason(self) -> str: ...


class ApiKeyMiddleware:
    """Rejects /v1 requests without ``Authorization: Bearer <key>``; /health and /metrics stay open."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):
                response = Unauthorized("Missing or invalid API key (send 'Authorization: Bearer <key>').",
                                        code="invalid_api_key").to_response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"Request body is larger than {max_bytes} bytes.")
    body = await request.body()
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"Request body is larger than {max_bytes} bytes.")
    return body


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


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


def build_app(
    client: EngineClient,
    config: ServerConfig,
    *,
    start: Callable[[], Awaitable[None]] | None = None,
    stop: Callable[[], Awaitable[None]] | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    components: Sequence[tuple[str, Readiness]] = (),
    agent: AgentSource | None = None,
    metrics: Metrics | None = None,
) -> Starlette:
    """The HTTP app over an ``EngineClient``; ``start``/``stop`` bring the engines up and down.

    ``components`` are further (code, component) pairs that ``/health`` waits for, e.g. the memory store."""
    metrics = metrics or Metrics()
    chat = ChatService(client, config, metrics)
    agent_chat = AgentChat(agent, config, metrics) if agent is not None else None
    created = int(time.time())

    async def chat_completions(request: Request) -> Response:
        body = chat.decode(await read_body(request, config.max_body_bytes))
        if body.model == AGENT_MODEL and agent_chat is not None:
            return await research(request, body)
        prepared = await chat.prepare(body)
        if prepared.request.stream:
            generation = await chat.open(prepared, stream=True)
            return StreamingResponse(chat.stream(prepared, generation), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await until_disconnect(request, _complete(prepared))

    async def research(request: Request, body: ChatCompletionRequest) -> Response:
        assert agent_chat is not None
        research_request = agent_chat.research_request(body)
        if body.stream:
            return StreamingResponse(agent_chat.stream(body, research_request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await until_disconnect(request, _research(body, research_request))

    async def _research(body: ChatCompletionRequest, research_request: Any) -> Response:
        assert agent_chat is not None
        return Response(await agent_chat.complete(body, research_request), media_type="application/json")

    async def _complete(prepared: Any) -> Response:
        generation = await chat.open(prepared, stream=False)
        return Response(await chat.complete(prepared, generation), media_type="application/json")

    def cards() -> list[ModelCard]:
        agent_card = [ModelCard(AGENT_MODEL, "agent", "mia")] if agent_chat is not None else []
        return [*client.models(), *agent_card]

    async def list_models(request: Request) -> Response:
        return json_response(ModelList([ModelObject(c.id, c.owned_by, c.root, created, c.adapter_version)
                                        for c in cards()]))

    async def get_model(request: Request) -> Response:
        model_id = request.path_params["model"]
        for card in cards():
            if card.id == model_id:
                return json_response(ModelObject(card.id, card.owned_by, card.root, created, card.adapter_version))
        hint = " (the research agent is not served by this build yet)" if model_id == AGENT_MODEL else ""
        raise NotFound(f"The model `{model_id}` does not exist{hint}.", param="model", code="model_not_found")

    async def health(request: Request) -> Response:
        """503 naming every component still starting (the engines and the index build run at once)."""
        waiting = [(code, component) for code, component in (("engine_not_ready", client), *components)
                   if not component.is_ready()]
        if waiting:
            raise Unavailable("; ".join(component.not_ready_reason() for _, component in waiting), code=waiting[0][0])
        return json_response({"status": "ok"})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        starting = asyncio.create_task(start()) if start else None
        try:
            yield
        finally:
            if starting and not starting.done():
                starting.cancel()
            if stop:
                await stop()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        *extra_routes,
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.state.metrics = metrics
    return app


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.to_response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = APIError(f"{request.method} {request.url.path}: {exc.detail}")
    error.status = exc.status_code
    error.type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error.to_response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    error = APIError(f"Internal server error: {type(exc).__name__}")
    error.status, error.type = 500, "internal_error"
    return error.to_response()
