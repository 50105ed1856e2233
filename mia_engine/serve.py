"""The one serving process: uvloop, the HTTP app, and behind it the ``Services`` (shared encoder, memory
store, engines, test-time learner, research agent: ``services.py``), which start after the server listens
(``/health`` answers 503 until they are up)."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn
import uvloop

from .config import MIAConfig
from .server.adapters_api import adapter_routes
from .server.admission import Admission
from .server.app import build_app
from .server.learner_api import learner_routes
from .server.memory_api import memory_routes
from .services import Services

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server, remembering the signal that stopped it, so that the stop is logged whether or not
    uvicorn's re-raised signal ends ``serve`` with KeyboardInterrupt: it does not where the process was
    started with SIGINT ignored (a background job of a non-interactive shell; the Ctrl-C test then
    failed in CI started that way)."""

    stopped_by: int | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        super().handle_exit(sig, frame)


def _stop_reason(sig: int) -> str:
    return "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name


async def _serve(config: MIAConfig) -> None:
    services = Services(config)
    admission = Admission(config.server.admission)
    routes = [*learner_routes(services.learner, services.roles, config.server, admission),
              *adapter_routes(services.roles.adapters, config.server, admission),
              *memory_routes(services.memory, config.server, admission)]
    app = build_app(services.roles, config.server, start=services.start, stop=services.stop, extra_routes=routes,
                    components=[("memory_not_ready", services.memory), ("agent_not_ready", services.agent)],
                    agent=services.agent, metrics=services.metrics, admission=admission)
    server = _Server(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, http="httptools", lifespan="on",
        log_level=config.server.log_level, access_log=config.server.access_log, timeout_graceful_shutdown=5,
        timeout_keep_alive=config.server.keep_alive_s))
    log.info("listening on http://%s:%d (memory, engines, learner and agent start in the background; "
             "/health turns 200 when ready)", config.server.host, config.server.port)
    await server.serve()
    if server.stopped_by is not None:
        log.info("stopped (%s)", _stop_reason(server.stopped_by))


def serve(config: MIAConfig) -> None:
    try:
        uvloop.run(_serve(config))
    except KeyboardInterrupt:
        # uvicorn shuts down on Ctrl-C, then raises the signal again for whoever else handles it; the
        # shutdown is done by then (engines stopped, store closed) and ``_serve`` has logged it, so a
        # traceback would only alarm.
        pass
