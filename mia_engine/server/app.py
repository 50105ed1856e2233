"""The Starlette app: routes, security middleware, admission, OpenAI-style errors, engine start in the
background.

The server listens at once; the engines start behind it, and until they are up every generation
request (and ``/health``) answers 503, so clients and orchestrators can wait for readiness.
"""

from __future__ import annotations

import asyncio
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

from ..config import AGENT_MODEL, ServerConfig
from ..engines.client import EngineClient, ModelCard
from .admission import Admission, AdmissionMiddleware
from .agent_api import AgentChat, AgentSource
from .body import read_json
from .chat import ChatService
from .errors import APIError, NotFound, Unavailable
from .limits import check_chat_limits
from .metrics import Metrics
from .openai_bodies import ChatCompletion, ChatCompletionRequest, ModelList, ModelObject
from .openapi import ApiRoute, openapi_document
from .security import SecurityMiddleware, require_admin

log = logging.getLogger(__name__)


class Readiness(Protocol):
    def is_ready(self) -> bool: ...

    def not_ready_reason(self) -> str: ...


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
    admission: Admission | None = None,
) -> Starlette:
    """The HTTP app over an ``EngineClient``; ``start``/``stop`` bring the engines up and down.

    ``components`` are further (code, component) pairs that ``/health`` waits for, e.g. the memory store;
    ``admission`` is shared with the ``extra_routes`` that bound their own concurrency."""
    metrics = metrics or Metrics()
    admission = admission or Admission(config.admission)
    chat = ChatService(client, config, metrics)
    agent_chat = AgentChat(agent, config, metrics) if agent is not None else None
    created = int(time.time())
    chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)

    async def chat_completions(request: Request) -> Response:
        body: ChatCompletionRequest = await read_json(request, config.max_body_bytes, chat_decoder)
        check_chat_limits(body, config.limits)
        if body.learn:
            require_admin(request, "Learning from a request (learn: true)", param="learn")
        if body.model == AGENT_MODEL and agent_chat is not None:
            return await admitted(request, body, f"route:{AGENT_MODEL}", config.admission.max_concurrent_research,
                                  research)
        chat.check_model(body.model)
        return await admitted(request, body, f"model:{body.model}", config.admission.max_concurrent_per_model,
                              generate)

    async def admitted(request: Request, body: ChatCompletionRequest, key: str, limit: int,
                       handler: Callable[[Request, ChatCompletionRequest], Awaitable[Response]]) -> Response:
        """Run ``handler`` in a slot of ``key``; a stream keeps its slot until it ends."""
        admission.acquire(key, limit, param="model")
        try:
            response = await handler(request, body)
        except BaseException:
            admission.release(key)
            raise
        if isinstance(response, StreamingResponse):
            return admission.held_by(key, response)
        admission.release(key)
        return response

    async def generate(request: Request, body: ChatCompletionRequest) -> Response:
        prepared = await chat.prepare(body)
        if prepared.request.stream:
            generation = await chat.open(prepared, stream=True)
            return StreamingResponse(chat.stream(prepared, generation), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await until_disconnect(request, _complete(prepared))

    async def research(request: Request, body: ChatCompletionRequest) -> Response:
        assert agent_chat is not None
        research_request = agent_chat.research_request(body)
        await agent_chat.check_fits(research_request)
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
        agent_card = [ModelCard(AGENT_MODEL, "agent", AGENT_MODEL)] if agent_chat is not None else []
        return [*client.models(), *agent_card]

    async def list_models(request: Request) -> Response:
        return json_response(ModelList([ModelObject(c.id, c.owned_by, c.root, created, c.adapter_version)
                                        for c in cards()]))

    async def get_model(request: Request) -> Response:
        model_id = request.path_params["model"]
        for card in cards():
            if card.id == model_id:
                return json_response(ModelObject(card.id, card.owned_by, card.root, created, card.adapter_version))
        raise NotFound(f"The model `{model_id}` does not exist.", param="model", code="model_not_found")

    async def health(request: Request) -> Response:
        """Unauthenticated: names every component still starting (the engines and the index build run at
        once) with its public progress, if it has one (``progress()``: counts and time left), never the
        reasons, which hold paths and errors (they are in the log)."""
        waiting = [(code, component) for code, component in (("engine_not_ready", client), *components)
                   if not component.is_ready()]
        if waiting:
            raise Unavailable("; ".join(_waiting_line(code, component) for code, component in waiting),
                              code=waiting[0][0])
        return json_response({"status": "ok"})

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

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
        ApiRoute("/v1/models", list_models, method="GET", summary="List the model ids served",
                 response_type=ModelList),
        ApiRoute("/v1/models/{model:path}", get_model, method="GET", summary="One model id",
                 response_type=ModelObject),
        ApiRoute("/v1/chat/completions", chat_completions, method="POST",
                 summary="Chat completion of a role, or a research answer (model `mia`)",
                 request_type=ChatCompletionRequest, response_type=ChatCompletion),
        Route("/openapi.json", openapi, methods=["GET"]),
        *extra_routes,
    ]
    document = msgspec.json.encode(openapi_document(routes))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.add_middleware(AdmissionMiddleware, admission=admission, limit=config.admission.max_concurrent_bodies)
    app.add_middleware(SecurityMiddleware, config=config)  # added last: runs first
    app.state.metrics = metrics
    app.state.admission = admission
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
    error = APIError("Internal server error (details are in the server log).")
    error.status, error.type = 500, "internal_error"
    return error.to_response()


def _waiting_line(code: str, component: Readiness) -> str:
    # looked up on the class: only a component whose class defines ``progress`` has public progress
    progress = getattr(type(component), "progress", None)
    detail = progress(component) if callable(progress) else ""
    return f"{code.removesuffix('_not_ready')} is not ready" + (f" ({detail})" if detail else "")
