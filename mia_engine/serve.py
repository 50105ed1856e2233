"""The one serving process: uvloop, the HTTP app, the engines (started behind the listening server)."""

from __future__ import annotations

import logging

import uvicorn
import uvloop

from .config import MIAConfig
from .engines.roles import RoleServer
from .server.adapters_api import adapter_routes
from .server.app import build_app

log = logging.getLogger(__name__)


async def _serve(config: MIAConfig) -> None:
    roles = RoleServer(config)
    app = build_app(roles, config.server, start=roles.start, stop=roles.shutdown,
                    extra_routes=adapter_routes(roles.adapters))
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, http="httptools", lifespan="on",
        log_level=config.server.log_level, access_log=config.server.access_log, timeout_graceful_shutdown=5))
    log.info("listening on http://%s:%d (engines start in the background; /health turns 200 when ready)",
             config.server.host, config.server.port)
    await server.serve()


def serve(config: MIAConfig) -> None:
    uvloop.run(_serve(config))
