"""Connection-level bounds, below the HTTP app: how many sockets are open (in all and per client address) and
how long a request's line and headers may take to arrive.

uvicorn starts no timer before a request's headers are complete, and the app's own deadlines
(``deadlines.py``) start only once a route reads the body, so without these a client could hold any number
of sockets by sending partial headers. ``LimitedHttpToolsProtocol`` is uvicorn's httptools protocol with
the bounds of one ``ConnectionLimits`` (shared by every connection of one server, handed to the protocol by
``http_protocol``'s factory): a connection over a cap is answered 503 and closed as it is accepted, before
anything of it is read or held, and one whose headers are late is closed; either counts against its own
address only. Between requests a keep-alive connection is uvicorn's (``server.keep_alive_s``).

``trusted_proxies`` is the other half of who a client is: uvicorn believes ``X-Forwarded-For`` only from
the proxies the config names, and only with ``server.proxy_headers``.

What operators see: ``ConnectionLimits`` counts open connections, refusals by cap and late-header closes in
plain integers on the event loop (no lock per event), which ``Metrics.watch_connections`` reads at each scrape
(``mia_connections_open``, ``mia_connections_refused_total{reason}``, ``mia_connections_header_timeouts_total``).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import resource
from collections.abc import Callable
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import ConnectionsConfig, ServerConfig
from .admission import client_key
from .errors import ErrorBody, ErrorDetail

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0
"""Refused and timed-out connections are logged at most once per kind in this many seconds (the first at
once, then one line of counts), so a flood cannot flood the log too."""
RESERVED_FILES = 1024
"""Open files the serving process keeps besides its connections (logs, journal, model files, engine pipes):
the open-files limit must hold ``max_connections`` plus these."""

REFUSAL_REASONS = {"max_connections": "total_cap", "max_connections_per_client": "per_client_cap"}
"""The ``reason`` label of ``mia_connections_refused_total`` for each cap (a field of ``server.connections``)."""

Peer = tuple[str, int] | None
"""A connection's remote (host, port); None where unknown (a Unix socket)."""
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProxyTrust:
    """Which peers are proxies whose ``X-Forwarded-For`` uvicorn believes (``server.proxy_headers``,
    ``server.forwarded_allow_ips``): they carry many clients, so no per-client connection cap applies to them."""

    def __init__(self, server: ServerConfig) -> None:
        self.is_on = server.proxy_headers
        self.trusts_any = "*" in server.forwarded_allow_ips
        self.networks: list[Network] = [ipaddress.ip_network(entry, strict=False)
                                        for entry in server.forwarded_allow_ips if entry != "*"]

    def trusts(self, host: str) -> bool:
        if not self.is_on:
            return False
        if self.trusts_any:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def allow_ips(self) -> list[str]:
        """``forwarded_allow_ips`` for uvicorn's Config, each entry a network it parses the same way."""
        return ["*"] if self.trusts_any else [str(network) for network in self.networks]


def trusted_proxies(server: ServerConfig) -> list[str]:
    """uvicorn's ``forwarded_allow_ips`` for ``server`` (never None: uvicorn would read its environment
    variable, or trust loopback)."""
    return ProxyTrust(server).allow_ips()


def _refusal(message: str, retry_after_s: int) -> bytes:
    """A whole 503 response that closes the connection, in the API's error shape."""
    body = msgspec.json.encode(ErrorBody(ErrorDetail(message, "service_unavailable", None, "too_many_connections")))
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: {retry_after_s}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class _EventLog:
    """Counts of one kind of event (a refusal, a timeout), logged at most once every ``LOG_INTERVAL_S``: the
    first of a quiet spell at once, the rest as one line of counts when the interval ends."""

    def __init__(self, template: str) -> None:
        self.template = template
        """``str.format`` text with ``{count}`` and ``{peer}`` (the last event's address)."""
        self._count = 0
        self._peer = ""
        self._flush: asyncio.TimerHandle | None = None

    def note(self, peer: Peer) -> None:
        self._count += 1
        self._peer = peer[0] if peer else "a local socket"
        if self._flush is None:
            self._emit()

    def _emit(self) -> None:
        if not self._count:
            self._flush = None
            return
        log.warning(self.template.format(count=self._count, peer=self._peer))
        self._count = 0
        self._flush = asyncio.get_running_loop().call_later(LOG_INTERVAL_S, self._emit)


class ConnectionLimits:
    """Open connections of one server, in all and by client address; event-loop only."""

    def __init__(self, config: ConnectionsConfig, trust: ProxyTrust, max_connections: int, retry_after_s: int) -> None:
        self.config = config
        self.trust = trust
        self.max_connections = max_connections
        """``config.max_connections``, or less where the open-files limit could not be raised to it."""
        self.num_open = 0
        self.num_refused = dict.fromkeys(REFUSAL_REASONS.values(), 0)
        """Connections refused at accept since the start, by ``REFUSAL_REASONS`` label."""
        self.num_late_headers = 0
        """Connections closed since the start because their request's line and headers were late."""
        self._by_client: dict[str, int] = {}
        per_client = config.max_connections_per_client
        self._refusals = {
            "max_connections": _refusal(f"The server has {max_connections} connections open, its limit "
                                        "(server.connections.max_connections); retry later.", retry_after_s),
            "max_connections_per_client": _refusal(
                f"Your address has {per_client} connections open, its limit "
                "(server.connections.max_connections_per_client); reuse or close one.", retry_after_s)}
        self._logs = {
            "max_connections": _EventLog(f"refused {{count}} connection(s) at {max_connections} open "
                                         "(server.connections.max_connections), the last from {peer}"),
            "max_connections_per_client": _EventLog(
                f"refused {{count}} connection(s) from an address with {per_client} open "
                "(server.connections.max_connections_per_client), the last from {peer}"),
            "header_timeout_s": _EventLog(
                f"closed {{count}} connection(s) whose request headers took over {config.header_timeout_s:g} s "
                "(server.connections.header_timeout_s), the last from {peer}")}

    def open(self, peer: Peer) -> bytes | None:
        """Count a new connection from ``peer``; over a cap, nothing is counted and the 503 to answer it
        with is returned."""
        key = self._key(peer)
        if self.max_connections and self.num_open >= self.max_connections:
            return self._refuse("max_connections", peer)
        if key is not None and self._by_client.get(key, 0) >= self.config.max_connections_per_client:
            return self._refuse("max_connections_per_client", peer)
        self.num_open += 1
        if key is not None:
            self._by_client[key] = self._by_client.get(key, 0) + 1
        return None

    def close(self, peer: Peer) -> None:
        """Uncount a connection ``open`` counted."""
        self.num_open -= 1
        key = self._key(peer)
        if key is None:
            return
        left = self._by_client.pop(key) - 1
        if left:
            self._by_client[key] = left

    def note_late_headers(self, peer: Peer) -> None:
        self.num_late_headers += 1
        self._logs["header_timeout_s"].note(peer)

    def _refuse(self, cap: str, peer: Peer) -> bytes:
        self.num_refused[REFUSAL_REASONS[cap]] += 1
        self._logs[cap].note(peer)
        return self._refusals[cap]

    def _key(self, peer: Peer) -> str | None:
        """The per-client count ``peer`` belongs to; None where no per-client cap applies to it."""
        if peer is None or not self.config.max_connections_per_client or self.trust.trusts(peer[0]):
            return None
        return client_key({"client": peer})


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a ``ConnectionLimits``: counted from accept to close, refused at
    accept when over a cap, and closed when a request's line and headers take over ``header_timeout_s``
    (from the connection's opening, or from the next request's first byte on a keep-alive connection)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._is_counted = False
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        refusal = self._limits.open(self.client)
        if refusal is not None:
            transport.write(refusal)
            transport.close()
            return
        self._is_counted = True
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        if self._is_counted:
            self._is_counted = False
            self._limits.close(self.client)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._start_header_timer()  # a keep-alive connection's next request begins (stray CRLFs too)
        super().data_received(data)

    def on_message_begin(self) -> None:
        if self._header_timer is None:
            self._start_header_timer()  # a request pipelined behind one still running
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        super().on_headers_complete()

    def _start_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self._limits.config.header_timeout_s, self._headers_late)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self._limits.note_late_headers(self.client)
            self.transport.close()


def fit_open_files_limit(max_connections: int) -> int:
    """Raise this process's soft open-files limit, up to the hard one, to hold ``max_connections`` plus
    ``RESERVED_FILES``; the connection cap that fits: ``max_connections`` (0, no cap, included), or less with
    a warning where the hard limit is lower, so that a flood meets the cap before ``accept`` fails."""
    if not max_connections:
        return 0
    wanted = max_connections + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    while target > soft:  # halved where refused: macOS caps it below an infinite hard limit
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            target //= 2
    if soft >= wanted:
        return max_connections
    fitted = max(soft - RESERVED_FILES, soft // 2)
    log.warning("the open-files limit is %d (ulimit -n, hard limit %d): server.connections.max_connections "
                "lowered from %d to %d", soft, hard, max_connections, fitted)
    return fitted


def http_protocol(server: ServerConfig, watch: Callable[[ConnectionLimits], None]) -> Callable[..., HttpToolsProtocol]:
    """uvicorn's ``http=`` for ``server``: a factory of ``LimitedHttpToolsProtocol`` sharing one
    ``ConnectionLimits`` (no module state: each server made from it has its own counts), handed to ``watch``
    (``Metrics.watch_connections``, which exports its counts)."""
    limits = ConnectionLimits(server.connections, ProxyTrust(server),
                              fit_open_files_limit(server.connections.max_connections),
                              server.admission.retry_after_s)
    watch(limits)
    return functools.partial(LimitedHttpToolsProtocol, limits=limits)
