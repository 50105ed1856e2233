"""``GET /health`` and ``GET /metrics``: what orchestrators and scrapers read, outside ``/v1``, in the
``public`` scope (``/metrics`` needs a key on a keyed non-loopback bind: ``security.py``).

``/health`` answers 503 until every component (the engines, and e.g. the memory store and the agent, which
start behind the listening server) is ready, naming each one still starting with its public progress.
Once ready, a component with something to report adds an entry under its code (``health_entry()``: the
test-time learner's restarts, ``learner/health.py``), which never turns the answer unhealthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from .errors import Unavailable
from .metrics import Metrics
from .openapi import ApiRoute
from .responses import json_response


class Readiness(Protocol):
    def is_ready(self) -> bool: ...

    def not_ready_reason(self) -> str: ...


def health_routes(components: Sequence[tuple[str, Readiness]], metrics: Metrics) -> list[BaseRoute]:
    """``components`` are the (code, component) pairs ``/health`` waits for, in the order it names them;
    the first one's code is the 503's ``code``."""
    handlers = HealthHandlers(components, metrics)
    return [
        ApiRoute("/health", handlers.health, method="GET", scope="public", summary="Ready (200) or not yet (503)"),
        ApiRoute("/metrics", handlers.prometheus, method="GET", scope="public", summary="Prometheus metrics",
                 media_type="text/plain"),
    ]


class HealthHandlers:
    def __init__(self, components: Sequence[tuple[str, Readiness]], metrics: Metrics) -> None:
        self._components = list(components)
        self._metrics = metrics

    async def health(self, request: Request) -> Response:
        """Unauthenticated: names every component still starting (the engines and the index build run at
        once) with its public progress, if it has one (``progress()``: counts and time left), never the
        reasons, which hold paths and errors (they are in the log)."""
        waiting = [(code, component) for code, component in self._components if not component.is_ready()]
        if waiting:
            raise Unavailable("; ".join(waiting_line(code, component) for code, component in waiting),
                              code=waiting[0][0])
        body: dict[str, Any] = {"status": "ok"}
        for code, component in self._components:
            entry = getattr(type(component), "health_entry", None)  # on the class, as ``progress``
            value = entry(component) if callable(entry) else None
            if value is not None:
                body[code] = value
        return json_response(body)

    async def prometheus(self, request: Request) -> Response:
        return Response(self._metrics.render(), media_type=self._metrics.content_type)


def waiting_line(code: str, component: Readiness) -> str:
    # looked up on the class: only a component whose class defines ``progress`` has public progress
    progress = getattr(type(component), "progress", None)
    detail = progress(component) if callable(progress) else ""
    return f"{code.removesuffix('_not_ready')} is not ready" + (f" ({detail})" if detail else "")
