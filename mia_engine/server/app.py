"""The Starlette app: the routes of every concern, security middleware, admission, OpenAI-style errors,
engine start in the background.

The server listens at once; the engines start behind it, and until they are up every generation
request (and ``/health``) answers 503, so clients and orchestrators can wait for readiness.

Each concern builds its own routes (``health_api``, ``models_api``, ``chat_api``, ``completions_api``,
``tokenize_api``, ``embeddings_api``, ``learner_api``, ``adapters_api``, ``lora_api``, ``memory_api``,
``openapi``);
``build_app`` builds every group from one ``AppParts``, which the composition root (``services.py``) fills,
and refuses to build an app with a route that declares no scope (``openapi.ApiRoute``, ``security.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..base.heap_trim import trim_heap_periodically
from ..base.log_text import printable
from ..config import ServerConfig
from ..engines.client import EngineClient
from .access_log import AccessLogMiddleware
from .adapters_api import adapter_routes
from .admission import Admission, AdmissionMiddleware
from .agent_api import AgentSource
from .chat_api import chat_routes
from .deadlines import DeadlineMiddleware
from .completions_api import completion_routes
from .embeddings_api import EncoderSource, embedding_routes
from .errors import APIError
from .health_api import Readiness, health_routes
from .learner_api import learner_routes
from .lora_api import lora_routes
from .memory_api import memory_routes
from .metrics import Metrics
from .models_api import model_routes
from .key_ring import KeyRing
from .openapi import openapi_routes, unscoped
from .security import SecurityMiddleware
from .tokenize_api import tokenize_routes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppParts:
    """Everything the HTTP app serves, built once by the composition root (``services.py: Services``).
    A part left out leaves its routes out (a test builds an app over a fake engine client alone)."""

    client: EngineClient
    config: ServerConfig
    admission: Admission | None = None
    """Shared by every route that bounds its concurrency (None: one from ``config.admission``)."""
    metrics: Metrics | None = None
    readiness: Sequence[tuple[str, Readiness]] = ()
    """Further (code, component) pairs ``/health`` waits for besides the engines (memory, agent)."""
    agent: AgentSource | None = None
    encoder: EncoderSource | None = None
    """The memory's sentence encoder, for ``/v1/embeddings``."""
    learner: Any = None
    """The test-time learner (``learner/ttl.py``), for the GRPO route."""
    adapters: Any = None
    """The adapter registry (``engines/adapters.py``), for listing and publishing adapters."""
    adapter_dirs: Sequence[Path] = ()
    """Folders a published adapter may be loaded from."""
    loras: Any = None
    """Adapters loaded and unloaded by name (``engines/lora_models.py``), for vLLM's load/unload routes."""
    planner: str = ""
    """The agent's Planner model id (``agent.roles.planner``): the ``mia`` card shows its context length."""
    memory: Any = None
    """The memory store's handle, for ``/v1/memory``."""
    start: Callable[[], Awaitable[None]] | None = None
    """Brings the engines and the rest up once the server listens."""
    stop: Callable[[], Awaitable[None]] | None = None


def build_app(parts: AppParts) -> Starlette:
    """The HTTP app: every route group of ``parts``, security, deadlines and admission, the lifespan that
    starts and stops what is behind it."""
    config, client = parts.config, parts.client
    metrics = parts.metrics or Metrics()
    admission = parts.admission or Admission(config.admission)
    routes: list[BaseRoute] = [
        *health_routes([("engine_not_ready", client), *parts.readiness], metrics),
        *model_routes(client, has_agent=parts.agent is not None, encoder=parts.encoder, planner=parts.planner),
        *chat_routes(client, config, admission, metrics, parts.agent),
        *completion_routes(client, config, admission, metrics, has_agent=parts.agent is not None),
        *tokenize_routes(client, config, admission),
        *(embedding_routes(parts.encoder, config, admission) if parts.encoder is not None else []),
        *(learner_routes(parts.learner, client, config, admission) if parts.learner is not None else []),
        *(adapter_routes(parts.adapters, config, admission, parts.adapter_dirs) if parts.adapters is not None else []),
        *(lora_routes(parts.loras, config, admission, parts.adapter_dirs) if parts.loras is not None else []),
        *(memory_routes(parts.memory, config, admission) if parts.memory is not None else []),
    ]
    routes.extend(openapi_routes(routes))
    check_scopes(routes)
    keys = KeyRing(config.keys_file)
    trim_heap = partial(trim_heap_periodically, config.malloc_trim_interval_s, metrics.record_heap_trim)
    lifespan = EngineLifespan(parts.start, parts.stop, [metrics.watch_loop_lag, trim_heap, keys.reload_on_sighup])
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.add_middleware(AdmissionMiddleware, admission=admission, limit=config.admission.max_concurrent_bodies)
    app.add_middleware(DeadlineMiddleware, config=config.admission)  # runs before admission: its 429s too
    app.add_middleware(SecurityMiddleware, config=config, keys=keys)  # added last: runs first
    if config.access_log:  # outside even security: every answer is logged, its 401s and 429s too
        app.add_middleware(AccessLogMiddleware)
    app.state.metrics = metrics
    app.state.admission = admission
    metrics.watch_admission(admission)
    return app


def check_scopes(routes: Sequence[BaseRoute]) -> None:
    """Refuse (``ValueError``, at start-up) routes that declare no scope: a route must never be open only
    because its author forgot to close it."""
    missing = unscoped(routes)
    if missing:
        raise ValueError(f"routes without a declared scope (build them as openapi.ApiRoute with scope=...): "
                         f"{', '.join(missing)}")


class EngineLifespan:
    """Starts the engines in the background once the server listens (so it answers 503 meanwhile), and
    at shutdown cancels a start still running, then stops them; the ``background`` tasks (the event-loop
    lag probe, the heap trimmer) run meanwhile."""

    def __init__(self, start: Callable[[], Awaitable[None]] | None,
                 stop: Callable[[], Awaitable[None]] | None,
                 background: Sequence[Callable[[], Awaitable[None]]] = ()) -> None:
        self._start = start
        self._stop = stop
        self._background = background

    @asynccontextmanager
    async def __call__(self, app: Starlette) -> AsyncIterator[None]:
        starting = asyncio.create_task(self._start()) if self._start else None
        background = [asyncio.create_task(task()) for task in self._background]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            if starting and not starting.done():
                starting.cancel()
            if self._stop:
                await self._stop()


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
    log.exception("internal error on %s %s", printable(request.method, 16), printable(request.url.path),
                  exc_info=exc)
    error = APIError("Internal server error (details are in the server log).")
    error.status, error.type = 500, "internal_error"
    return error.to_response()
