"""Admission control: bounded concurrency per model and per route, with a bounded FIFO queue per key.

A request over its key's bound waits in that key's queue (first come, first served) until a slot frees,
as ``vllm serve`` queues; it gets 429 with ``Retry-After`` only when the queue is full
(``max_queued_per_key``) or its wait passes ``max_queue_wait_s``. A client that goes away while queued
leaves the queue at once. A slot is held until the response (a stream included) is finished, and a
freed slot passes straight to the first waiter, so a late arrival never overtakes the queue.

Each client has its own key before the body bound, so one client cannot take every slot: a request with a
key of ``server.keys_file`` is its key's (``client:key:<name>``, bound by the entry's ``max_concurrent``
where set), whatever address it comes from; any other is its address's (``client:<address>``), loopback
included unless ``bound_loopback_clients`` is off. Those keys are reported together as ``server:clients``
(one series, whatever the number of clients). A client that stalls its body or stops reading is cut off by
``deadlines.py``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import AdmissionConfig
from .errors import APIError, TooManyRequests
from .security import KEY_ENTRY_KEY

CLIENT_PREFIX = "client:"
"""Keys of one client address each: counted, but reported together under ``CLIENTS_KEY``."""
CLIENTS_KEY = "server:clients"


class ClientGone(APIError):
    """The client disconnected while its request waited for a slot (nobody reads the answer)."""

    status = 499
    type = "client_closed_request"


class KeyStats(msgspec.Struct):
    """What one key's queue did since start: for ``/metrics``."""

    num_admitted: int = 0
    """Requests that got a slot (at once or after waiting)."""
    wait_seconds: float = 0.0
    """Sum of the time those requests waited in the queue, in seconds."""
    num_rejected: dict[str, int] = {}
    """429s and departures by reason: ``queue_full``, ``deadline``, ``disconnected``."""


class Admission:
    """Running counts and FIFO waiters by key (``model:planner``, ``route:mia``, ...); event-loop only."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._running: dict[str, int] = {}
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self.stats: dict[str, KeyStats] = {}

    async def acquire(self, key: str, limit: int, *, param: str | None = None,
                      request: Request | None = None) -> None:
        """Take a slot of ``key`` (at most ``limit`` held at once), waiting in its queue if need be; pair
        with ``release``. 429 when the queue is full or the wait deadline passes; ``request``: leave the
        queue (``ClientGone``) if its client disconnects (its body must have been read already)."""
        if self._running.get(key, 0) < limit and not self._waiters.get(key):
            self._running[key] = self._running.get(key, 0) + 1
            self._admitted(key, 0.0)
            return
        queue = self._waiters.setdefault(key, deque())
        if len(queue) >= self.config.max_queued_per_key:
            raise self._refusal(key, "queue_full", f"{_name(key)} is at its limit of {limit} concurrent requests "
                                f"and {len(queue)} waiting (server.admission.max_queued_per_key)", param)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(future)
        start = time.monotonic()
        outcome = await self._wait(key, future, request)
        if outcome == "deadline":
            raise self._refusal(key, "deadline", f"{_name(key)} waited {self.config.max_queue_wait_s:g} s for one of "
                                f"its {limit} slots (server.admission.max_queue_wait_s)", param)
        if outcome == "disconnected":
            self._count(key, "disconnected")
            raise ClientGone("The client disconnected while its request waited for a slot.")
        self._admitted(key, time.monotonic() - start)

    async def _wait(self, key: str, future: asyncio.Future[None], request: Request | None) -> str:
        """Wait for ``future`` (a slot handed over by ``release``): ``admitted``, ``deadline`` or
        ``disconnected``; a cancelled waiter leaves the queue (or passes on a slot it was just given)."""
        watcher = asyncio.ensure_future(_disconnected(request)) if request is not None else None
        try:
            await asyncio.wait({future, *([watcher] if watcher else [])}, timeout=self.config.max_queue_wait_s,
                               return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._leave(key, future)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        if future.done():
            return "admitted"
        self._leave(key, future)
        return "disconnected" if watcher is not None and watcher.done() else "deadline"

    def _leave(self, key: str, future: asyncio.Future[None]) -> None:
        """Take ``future`` out of ``key``'s queue; a slot already handed to it goes to the next waiter."""
        if future.done() and not future.cancelled():
            self.release(key)
            return
        future.cancel()
        queue = self._waiters.get(key)
        if queue is not None and future in queue:
            queue.remove(future)
            if not queue:
                del self._waiters[key]

    def release(self, key: str) -> None:
        """Give back a slot of ``key``: to the first waiter if any, else to the pool."""
        queue = self._waiters.get(key)
        while queue:
            future = queue.popleft()
            if not future.done():
                future.set_result(None)  # the slot changes hands: the running count stays
                if not queue:
                    del self._waiters[key]
                return
        self._waiters.pop(key, None)
        self._running[key] -= 1
        if not self._running[key]:
            del self._running[key]  # keys come from requests: keep only the running ones

    def running(self, key: str) -> int:
        if key == CLIENTS_KEY:
            return sum(n for k, n in self._running.items() if k.startswith(CLIENT_PREFIX))
        return self._running.get(key, 0)

    def queued(self, key: str) -> int:
        if key == CLIENTS_KEY:
            return sum(len(q) for k, q in self._waiters.items() if k.startswith(CLIENT_PREFIX))
        return len(self._waiters.get(key, ()))

    def keys(self) -> list[str]:
        """Every key seen: running, queued or counted (client keys as one, ``CLIENTS_KEY``)."""
        seen = {_reported(key) for key in (*self._running, *self._waiters)}
        return sorted({*seen, *self.stats})

    @asynccontextmanager
    async def slot(self, key: str, limit: int, *, param: str | None = None,
                   request: Request | None = None) -> AsyncIterator[None]:
        await self.acquire(key, limit, param=param, request=request)
        try:
            yield
        finally:
            self.release(key)

    def held_by(self, key: str, response: Response) -> Response:
        """``response`` that releases ``key`` (already acquired) once it is sent, or abandoned mid-way."""
        return _Held(self, key, response)  # type: ignore[return-value]

    def _admitted(self, key: str, waited_s: float) -> None:
        stats = self.stats.setdefault(_reported(key), KeyStats(num_rejected={}))
        stats.num_admitted += 1
        stats.wait_seconds += waited_s

    def _count(self, key: str, reason: str) -> None:
        rejected = self.stats.setdefault(_reported(key), KeyStats(num_rejected={})).num_rejected
        rejected[reason] = rejected.get(reason, 0) + 1

    def _refusal(self, key: str, reason: str, what: str, param: str | None) -> TooManyRequests:
        self._count(key, reason)
        return TooManyRequests(f"{what}; retry in {self.config.retry_after_s} s.",
                               retry_after_s=self.config.retry_after_s, param=param)


def _name(key: str) -> str:
    return key.split(":", 1)[-1]


def _reported(key: str) -> str:
    """The key a slot's statistics are kept under: client keys come and go with clients, so one for all."""
    return CLIENTS_KEY if key.startswith(CLIENT_PREFIX) else key


def client_key(scope: Scope) -> str | None:
    """``client:<address>`` of the request's peer (an IPv6 peer by its /64, which one host usually holds
    whole); None where the server does not know it (a Unix socket)."""
    client = scope.get("client")
    if not client:
        return None
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return f"{CLIENT_PREFIX}{client[0]}"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return f"{CLIENT_PREFIX}{address.ipv4_mapped}"
        return f"{CLIENT_PREFIX}{ipaddress.ip_network(f'{address}/64', strict=False)}"
    return f"{CLIENT_PREFIX}{address}"


def _is_loopback(scope: Scope) -> bool:
    try:
        address = ipaddress.ip_address(scope["client"][0])
    except (TypeError, ValueError, IndexError):
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


async def _disconnected(request: Request) -> None:
    """Return once the client of ``request`` (its body already read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Held:
    """An ASGI response wrapper: the release runs whether the body finished, failed or was cancelled."""

    def __init__(self, admission: Admission, key: str, response: Response) -> None:
        self._admission, self._key, self._response = admission, key, response
        self.status_code = response.status_code

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._response(scope, receive, send)
        finally:
            self._admission.release(self._key)
            body = getattr(self._response, "body_iterator", None)
            if hasattr(body, "aclose"):  # a stream cut off mid-way: cancel its generation now, not at GC
                await body.aclose()


class AdmissionMiddleware:
    """One bound over every request with a body in flight (uploads included, before any route's own bound),
    so concurrent bodies can never hold more than ``limit`` × ``max_body_bytes`` of memory, and before it a
    bound per client (its ``keys_file`` key, else its address: ``max_concurrent_per_client``), so one client
    cannot take every body slot nor,
    through them, every model slot. Requests over either queue like any key's: a queued request has not had
    its body read, so waiting costs no body memory."""

    def __init__(self, app: ASGIApp, admission: Admission, limit: int) -> None:
        self.app = app
        self.admission = admission
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        held: list[str] = []
        try:
            try:
                for key, limit in self._keys(scope):
                    await self.admission.acquire(key, limit)
                    held.append(key)
            except TooManyRequests as err:
                await err.to_response()(scope, receive, send)
                return
            await self.app(scope, receive, send)
        except ClientDisconnect:
            pass  # gone while its body was read: nobody to answer
        finally:
            for key in reversed(held):
                self.admission.release(key)

    def _keys(self, scope: Scope) -> list[tuple[str, int]]:
        client, limit = self._client(scope)
        return [*([(client, limit)] if client else []), ("server:bodies", self.limit)]

    def _client(self, scope: Scope) -> tuple[str | None, int]:
        """The request's per-client key and bound: its ``keys_file`` key's, else its address's (None: none)."""
        config = self.admission.config
        entry = scope.get(KEY_ENTRY_KEY)
        if entry is not None:
            limit = entry.max_concurrent or config.max_concurrent_per_client
            return (f"{CLIENT_PREFIX}key:{entry.name}" if limit else None), limit
        if not config.max_concurrent_per_client or (not config.bound_loopback_clients and _is_loopback(scope)):
            return None, 0
        return client_key(scope), config.max_concurrent_per_client
