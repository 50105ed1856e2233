"""The one serving process: uvloop, the HTTP app, and behind it the ``Services`` (shared encoder, memory
store, engines, test-time learner, research agent: ``services.py``), which start after the server listens
(``/health`` answers 503 until they are up)."""

from __future__ import annotations

import logging

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


async def _serve(config: MIAConfig) -> None:
    services = Services(config)
    admission = Admission(config.server.admission)
    routes = [*learner_routes(services.learner, services.roles, config.server, admission),
              *adapter_routes(services.roles.adapters, config.server, admission),
              *memory_routes(services.memory, config.server, admission)]
    app = build_app(services.roles, config.server, start=services.start, stop=services.stop, extra_routes=routes,
                    components=[("memory_not_ready", services.memory), ("agent_not_ready", services.agent)],
                    agent=services.agent, metrics=services.metrics, admission=admission)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, http="httptools", lifespan="on",
        log_level=config.server.log_level, access_log=config.server.access_log, timeout_graceful_shutdown=5,
        timeout_keep_alive=config.server.keep_alive_s))
    log.info("listening on http://%s:%d (memory, engines, learner and agent start in the background; "
             "/health turns 200 when ready)", config.server.host, config.server.port)
    await server.serve()


def serve(config: MIAConfig) -> None:
    try:
        uvloop.run(_serve(config))
    except KeyboardInterrupt:
        # uvicorn shuts down on Ctrl-C, then raises the signal again for whoever else handles it; the
        # shutdown is done by then (engines stopped, store closed), so a traceback would only alarm.
        log.info("stopped (Ctrl-C)")
