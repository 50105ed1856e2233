"""Admission control: bounded concurrency per model and per route, refused at once when full.

A request either gets a slot now or a 429 with ``Retry-After``: nothing waits in an unbounded queue,
so an overload costs the client a retry, never the server its memory or its latency for everyone.
A slot is held until the response (a stream included) is finished.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import AdmissionConfig
from .errors import TooManyRequests


class Admission:
    """Counters of running requests by key (``model:planner``, ``route:memory``, ...); event-loop only."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._running: dict[str, int] = {}

    def acquire(self, key: str, limit: int, *, param: str | None = None) -> None:
        """Take a slot of ``key`` or raise 429; pair with ``release``."""
        running = self._running.get(key, 0)
        if running >= limit:
            raise TooManyRequests(f"{key.split(':', 1)[-1]} is at its limit of {limit} concurrent requests; "
                                  f"retry in {self.config.retry_after_s} s.", retry_after_s=self.config.retry_after_s,
                                  param=param)
        self._running[key] = running + 1

    def release(self, key: str) -> None:
        self._running[key] -= 1
        if not self._running[key]:
            del self._running[key]  # keys come from requests: keep only the running ones

    def running(self, key: str) -> int:
        return self._running.get(key, 0)

    @contextmanager
    def slot(self, key: str, limit: int, *, param: str | None = None) -> Iterator[None]:
        self.acquire(key, limit, param=param)
        try:
            yield
        finally:
            self.release(key)

    def held_by(self, key: str, response: Response) -> Response:
        """``response`` that releases ``key`` (already acquired) once it is sent, or abandoned mid-way."""
        return _Held(self, key, response)  # type: ignore[return-value]


class _Held:
    """An ASGI response wrapper: the release runs whether the body finished, failed or was cancelled."""

    def __init__(self, admission: Admission, key: str, response: Response) -> None:
        self._admission, self._key, self._response = admission, key, response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._response(scope, receive, send)
        finally:
            self._admission.release(self._key)


class AdmissionMiddleware:
    """One bound over every request with a body in flight (uploads included, before any route's own bound),
    so concurrent bodies can never hold more than ``limit`` × ``max_body_bytes`` of memory."""

    def __init__(self, app: ASGIApp, admission: Admission, limit: int) -> None:
        self.app = app
        self.admission = admission
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        try:
            self.admission.acquire("server:bodies", self.limit)
        except TooManyRequests as err:
            await err.to_response()(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.release("server:bodies")
