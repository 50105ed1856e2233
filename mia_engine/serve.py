"""The one serving process: uvloop, the HTTP app, and behind it the ``Services`` (shared encoder, memory
store, engines, test-time learner, research agent: ``services.py``), which start after the server listens
(``/health`` answers 503 until they are up). An engine that fails to start or dies ends the process with
exit status 1 and the cause on stderr, as ``vllm serve`` does, so an orchestrator restarts it."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
import uvloop

from .config import MIAConfig
from .server.app import build_app
from .server.connections import http_protocol, trusted_proxies
from .services import Services

log = logging.getLogger(__name__)

FAILURE_GRACE_S = 3.0
"""After an engine failed, how long requests in flight get before the process exits (those on the dead
engine fail at once); short, so the process is gone within seconds whatever ``shutdown_timeout_s`` says."""


class _Server(uvicorn.Server):
    """uvicorn's server, remembering the signal that stopped it, so that the stop is logged whether or not
    uvicorn's re-raised signal ends ``serve`` with KeyboardInterrupt: it does not where the process was
    started with SIGINT ignored (a background job of a non-interactive shell; the Ctrl-C test then
    failed in CI started that way)."""

    stopped_by: int | None = None
    failure: str | None = None
    """Why the services failed (an engine did not start or died): the process then exits with status 1."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        super().handle_exit(sig, frame)

    async def run_services(self, services: Services) -> None:
        """Start the services and watch them (the app's lifespan runs this once the server listens, and
        cancels it at shutdown); stop the server on a failure."""
        self.fail(await services.run_until_failure())

    def fail(self, cause: str) -> None:
        """Stop the server because the services failed; ignored once a signal is stopping it (Ctrl-C in a
        terminal stops vLLM's engine core too, which is then no failure)."""
        if self.should_exit:
            return
        log.error("%s; shutting down", cause)
        self.failure = cause
        self.config.timeout_graceful_shutdown = min(FAILURE_GRACE_S, self.config.timeout_graceful_shutdown or 0)
        self.should_exit = True


def _listening_sockets(config: uvicorn.Config, send_buffer_bytes: int) -> list[socket.socket] | None:
    """The listening socket with ``send_buffer_bytes`` as its ``SO_SNDBUF``, which every accepted connection
    inherits; None (uvicorn binds its own, the kernel sizes the buffers) when it is 0."""
    if not send_buffer_bytes:
        return None
    sock = config.bind_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    return [sock]


def _stop_reason(sig: int) -> str:
    return "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name


async def _serve(config: MIAConfig) -> str | None:
    services = Services(config)
    app = build_app(services.app_parts(start=lambda: server.run_services(services)))
    protocol: Any = http_protocol(config.server, services.metrics.watch_connections)  # uvicorn calls it as a class; its hint names only classes
    server = _Server(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, http=protocol, ws="none", lifespan="on",
        log_level=config.server.log_level, access_log=False,  # server.access_log: server/access_log.py's, escaped
        timeout_graceful_shutdown=config.server.shutdown_timeout_s, timeout_keep_alive=config.server.keep_alive_s,
        proxy_headers=config.server.proxy_headers, forwarded_allow_ips=trusted_proxies(config.server),
        log_config=None))
    log.info("listening on http://%s:%d (memory, engines, learner and agent start in the background; "
             "/health turns 200 when ready)", config.server.host, config.server.port)
    await server.serve(sockets=_listening_sockets(server.config, config.server.admission.send_buffer_bytes))
    if server.stopped_by is not None:
        log.info("stopped (%s)", _stop_reason(server.stopped_by))
    return server.failure


def serve(config: MIAConfig, prog: str) -> int:
    """Serve until stopped: 0 after a signal, 1 (the cause on stderr, one line after ``prog``) when an
    engine failed to start or died."""
    try:
        failure = uvloop.run(_serve(config))
    except KeyboardInterrupt:
        # uvicorn shuts down on Ctrl-C, then raises the signal again for whoever else handles it; the
        # shutdown is done by then (engines stopped, store closed) and ``_serve`` has logged it, so a
        # traceback would only alarm.
        return 0
    if failure is None:
        return 0
    print(f"{prog}: error: {' '.join(failure.split())}", file=sys.stderr)  # one line: the traceback is logged
    return 1
