"""Connection-level bounds of the real server (``server/connections.py``): sockets that never finish their
headers are closed at the header deadline, one address cannot hold more than its connections (and other
addresses keep connecting), the server holds no more than its total, and ``X-Forwarded-For`` is believed
only from the proxies the config names, never by default. ``/metrics`` counts each refusal and late close,
and its gauge of open connections returns to where it was once a test's sockets are closed.

The servers are tested as soon as they listen: these bounds sit below the app, so the engines need not be
ready (their start runs meanwhile, and is cut short when the servers stop)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mia_engine.config import ConfigError, load_config
from mia_engine.config.server import ConnectionsConfig, ServerConfig
from mia_engine.server.connections import ConnectionLimits, ProxyTrust
from tests.conftest import SERVING_ONLY, ServerHandle, _stop_in_background, scrape_metrics, start_server

HEADER_TIMEOUT_S = 1.0
PER_CLIENT = 4
MAX_CONNECTIONS = 12
TRUSTED_PROXY = "127.0.0.2"
PROXIED_PER_CLIENT = 2
SLACK_S = 3.0
"""Beyond a deadline, time for the server to act on it while its engine starts beside the test."""
LISTEN_TIMEOUT_S = 180.0
LIGHT = ("--tools.max_passages=8", "--server.access_log=true", *SERVING_ONLY)
"""A small search index to build while the test runs; the access log shows each request's client address; the
serving process alone is under test."""


def _launch(tmp: Path, *extra: str) -> ServerHandle:
    return start_server(tmp, "tiny", *LIGHT, f"--tools.index_dir={tmp / 'index'}", *extra)


def _wait_listening(server: ServerHandle) -> None:
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            httpx.get(f"{server.base_url}/health", timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError(f"server not listening after {LISTEN_TIMEOUT_S} s:\n{server.log_tail()}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerHandle]]:
    """``limited``: small connection bounds, proxy headers as by default; ``proxied``: proxy headers on,
    trusting ``TRUSTED_PROXY`` only, and a small per-client cap. Both started at once."""
    launched = {
        "limited": _launch(tmp_path_factory.mktemp("limited"),
                           f"--server.connections.header_timeout_s={HEADER_TIMEOUT_S}",
                           f"--server.connections.max_connections_per_client={PER_CLIENT}",
                           f"--server.connections.max_connections={MAX_CONNECTIONS}"),
        "proxied": _launch(tmp_path_factory.mktemp("proxied"), "--server.proxy_headers=true",
                           f'--server.forwarded_allow_ips=["{TRUSTED_PROXY}"]',
                           f"--server.connections.max_connections_per_client={PROXIED_PER_CLIENT}")}
    try:
        for server in launched.values():
            _wait_listening(server)
        yield launched
    finally:
        for server in launched.values():
            _stop_in_background(server)


def _metric(server: ServerHandle, name: str, **labels: str) -> float:
    """One sample of the server's ``/metrics`` (its own scrape's connection is open meanwhile, and counted)."""
    return next(sample.value for sample in scrape_metrics(server)
                if sample.name == name and labels.items() <= sample.labels.items())


def _connection_counts(server: ServerHandle) -> dict[str, float]:
    return {"open": _metric(server, "mia_connections_open"),
            "late": _metric(server, "mia_connections_header_timeouts_total"),
            "total_cap": _metric(server, "mia_connections_refused_total", reason="total_cap"),
            "per_client_cap": _metric(server, "mia_connections_refused_total", reason="per_client_cap")}


def _moved(server: ServerHandle, before: dict[str, float]) -> dict[str, float]:
    """How far each count moved since ``before``, once the open connections are back to ``before``'s (the
    server counts a connection out as its FIN arrives)."""
    deadline = time.monotonic() + 10
    while (now := _connection_counts(server))["open"] != before["open"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return {name: now[name] - before[name] for name in now}


def _connect(server: ServerHandle, source: str) -> socket.socket:
    """A raw connection from ``source`` (any 127.0.0.0/8 address is this host's on Linux)."""
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def _request(sock: socket.socket, server: ServerHandle, path: str = "/version", headers: str = "") -> bytes:
    """One GET on ``sock`` (kept alive); the response's head and body."""
    host = server.base_url.removeprefix("http://")
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {server.api_key}\r\n{headers}\r\n"
                 .encode())
    return _read_response(sock)


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (a ``content-length`` one, as every answer here is)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data + body!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _refusal(sock: socket.socket) -> dict:
    """The 503 a connection over a cap is answered with before it sends anything; then the server closes it."""
    response = _read_response(sock)
    assert _status(response) == 503, response
    assert sock.recv(1024) == b""  # closed at once
    return json.loads(response.partition(b"\r\n\r\n")[2])["error"]


def _seconds_until_closed(sock: socket.socket, opened: float, trickle: bytes = b"", timeout_s: float = 10.0) -> float:
    """Seconds from ``opened`` until the server closes ``sock``, sending ``trickle`` a byte every 0.2 s
    meanwhile (a client trickling its headers)."""
    sock.settimeout(0.2)
    pending = list(trickle)
    while time.monotonic() - opened < timeout_s:
        try:
            data = sock.recv(1024)
        except TimeoutError:
            if pending:
                try:
                    sock.send(bytes([pending.pop(0)]))
                except (BrokenPipeError, ConnectionResetError):
                    return time.monotonic() - opened
            continue
        except ConnectionResetError:
            return time.monotonic() - opened
        assert data == b"", f"the server answered a request it never finished: {data[:200]!r}"
        return time.monotonic() - opened
    raise AssertionError(f"still open {timeout_s} s after it opened")


def test_connections_whose_headers_stall_or_trickle_are_closed_at_the_deadline(servers) -> None:
    """Each from an address of its own (the per-client cap is not what closes them)."""
    server = servers["limited"]
    before = _connection_counts(server)
    host = server.base_url.removeprefix("http://")
    cases = {"silent": b"", "partial line": b"GET /vers",
             "partial headers": f"GET /version HTTP/1.1\r\nHost: {host}\r\n".encode()}
    trickled = f"GET /version HTTP/1.1\r\nHost: {host}\r\nX-Slow: {'a' * 40}\r\n\r\n".encode()
    opened = {}
    try:
        for i, (name, data) in enumerate(cases.items()):
            opened[name] = (_connect(server, f"127.0.3.{i}"), time.monotonic())
            opened[name][0].sendall(data)
        closed = {name: _seconds_until_closed(sock, start) for name, (sock, start) in opened.items()}
        opened["trickled"] = (_connect(server, "127.0.3.10"), time.monotonic())  # never idle 0.2 s, still late
        closed["trickled"] = _seconds_until_closed(*opened["trickled"], trickled)
        keep_alive = _connect(server, "127.0.3.11")
        opened["keep-alive"] = (keep_alive, time.monotonic())
        assert _status(_request(keep_alive, server)) == 200  # a finished request; then the next one's first bytes
        keep_alive.sendall(b"GET /version HTTP/1.1\r\n")
        closed["keep-alive"] = _seconds_until_closed(keep_alive, time.monotonic())
    finally:
        for sock, _ in opened.values():
            sock.close()
    late = {name: round(s, 2) for name, s in closed.items()
            if not HEADER_TIMEOUT_S - 0.1 <= s <= HEADER_TIMEOUT_S + SLACK_S}
    assert not late, f"closed outside the {HEADER_TIMEOUT_S} s deadline: {late}"
    assert "server.connections.header_timeout_s" in server.log_path.read_text()
    assert _moved(server, before) == {"open": 0, "late": len(closed), "total_cap": 0, "per_client_cap": 0}


def _held(server: ServerHandle, source: str, count: int) -> list[socket.socket]:
    """``count`` connections from ``source``, each with one answered request, then idle (kept alive: no
    header deadline runs between requests)."""
    sockets = []
    for _ in range(count):
        sockets.append(_connect(server, source))
        assert _status(_request(sockets[-1], server)) == 200
    return sockets


def _close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
    time.sleep(0.2)  # the server counts them out as their FIN arrives


def test_one_address_is_refused_past_its_connections_while_others_connect(servers) -> None:
    server = servers["limited"]
    before = _connection_counts(server)
    held = _held(server, "127.0.0.3", PER_CLIENT)
    try:
        assert _connection_counts(server)["open"] == before["open"] + PER_CLIENT
        with _connect(server, "127.0.0.3") as over:
            error = _refusal(over)
        assert error["code"] == "too_many_connections" and "max_connections_per_client" in error["message"], error
        with _connect(server, "127.0.0.4") as other:
            assert _status(_request(other, server)) == 200
    finally:
        _close_all(held)
    with _connect(server, "127.0.0.3") as again:  # its closed connections count no more
        assert _status(_request(again, server)) == 200
    assert "server.connections.max_connections_per_client" in server.log_path.read_text()
    assert _moved(server, before) == {"open": 0, "late": 0, "total_cap": 0, "per_client_cap": 1}


def test_the_server_refuses_connections_past_its_total(servers) -> None:
    server = servers["limited"]
    before = _connection_counts(server)
    sources = [f"127.0.1.{i}" for i in range(MAX_CONNECTIONS // PER_CLIENT)]
    held = [sock for source in sources for sock in _held(server, source, PER_CLIENT)]
    try:
        with _connect(server, "127.0.2.1") as over:
            error = _refusal(over)
        assert "server.connections.max_connections)" in error["message"], error
    finally:
        _close_all(held)
    with _connect(server, "127.0.2.1") as again:
        assert _status(_request(again, server)) == 200
    assert _moved(server, before) == {"open": 0, "late": 0, "total_cap": 1, "per_client_cap": 0}


def _logged_client(server: ServerHandle, source: str, forwarded_for: str) -> str:
    """The client address the access log shows for a request from ``source`` with ``X-Forwarded-For`` (to a
    path of its own, which the line holds: ``<host>:<port> <key name or -> "GET <path>...``)."""
    path = f"/probe-{uuid.uuid4().hex}"
    with _connect(server, source) as sock:
        _request(sock, server, path, f"X-Forwarded-For: {forwarded_for}\r\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(rf'(\S+):\d+ \S+ "GET {path}[ "]', server.log_path.read_text())
        if found:
            return found[1]
        time.sleep(0.1)
    raise AssertionError(f"no access log line for {path}:\n{server.log_tail()}")


def test_forwarded_for_is_believed_only_from_named_proxies(servers) -> None:
    # by default no peer is a proxy: a local user cannot pose as another address
    assert _logged_client(servers["limited"], "127.0.0.1", "1.2.3.4") == "127.0.0.1"
    assert _logged_client(servers["proxied"], TRUSTED_PROXY, "1.2.3.4") == "1.2.3.4"
    assert _logged_client(servers["proxied"], "127.0.0.1", "1.2.3.4") == "127.0.0.1"


def test_a_trusted_proxy_is_not_bound_per_client(servers) -> None:
    """A proxy carries many clients: its connections count in the total only, others' per client too."""
    server = servers["proxied"]
    held = _held(server, TRUSTED_PROXY, PROXIED_PER_CLIENT + 1)
    held += _held(server, "127.0.0.1", PROXIED_PER_CLIENT)
    try:
        with _connect(server, "127.0.0.1") as over:
            assert "max_connections_per_client" in _refusal(over)["message"]
    finally:
        _close_all(held)


# ---- the counting rules, without a server ------------------------------------------------------------------


def _limits(per_client: int, max_connections: int = 100, **server: object) -> ConnectionLimits:
    config = ServerConfig(connections=ConnectionsConfig(max_connections_per_client=per_client), **server)
    return ConnectionLimits(config.connections, ProxyTrust(config), max_connections, retry_after_s=1)


def test_an_ipv6_client_is_counted_by_its_64_and_its_closed_connections_free_their_slots() -> None:
    async def run() -> None:
        limits = _limits(per_client=2)
        same_64 = [("2001:db8::1", 1), ("2001:db8::ffff", 2), ("2001:db8::abcd", 3)]
        assert limits.open(same_64[0]) is None and limits.open(same_64[1]) is None
        assert b"max_connections_per_client" in (limits.open(same_64[2]) or b"")
        assert limits.open(("2001:db8:0:1::1", 4)) is None  # the next /64 is another client
        assert limits.open(("::ffff:10.0.0.1", 5)) is None and limits.open(("10.0.0.1", 6)) is None
        assert limits.open(("10.0.0.1", 7)) is not None  # an IPv4-mapped peer is its IPv4 address
        limits.close(same_64[0])
        assert limits.open(same_64[2]) is None
        assert limits.num_open == 5

    asyncio.run(run())


def test_the_total_binds_everyone_and_a_trusted_proxy_only_the_total() -> None:
    async def run() -> None:
        limits = _limits(per_client=1, max_connections=3, proxy_headers=True, forwarded_allow_ips=["10.1.0.0/16"])
        assert limits.open(("10.1.2.3", 1)) is None and limits.open(("10.1.2.3", 2)) is None  # the proxy
        assert limits.open(("10.2.0.1", 3)) is None
        assert b"server.connections.max_connections)" in (limits.open(("10.3.0.1", 4)) or b"")

    asyncio.run(run())


@pytest.mark.parametrize("overrides, field", [
    ({"server.proxy_headers": True}, "server.proxy_headers"),
    ({"server.forwarded_allow_ips": ["proxy.local"]}, "server.forwarded_allow_ips"),
    ({"server.connections.header_timeout_s": 0}, "server.connections.header_timeout_s"),
])
def test_invalid_connection_settings_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: "):
        load_config("tiny", overrides)
