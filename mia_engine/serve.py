"""The one serving process: uvloop, the HTTP app, and behind it the shared encoder, the memory store,
the engines and the research agent, which start after the server listens (``/health`` answers 503
until all are up)."""

from __future__ import annotations

import asyncio
import logging

import uvicorn
import uvloop

from .agent.handle import AgentHandle
from .config import MIAConfig
from .engines.roles import RoleServer
from .memory.embedder import Embedder
from .memory.handle import MemoryHandle
from .memory.routes import memory_routes
from .server.adapters_api import adapter_routes
from .server.app import build_app

log = logging.getLogger(__name__)


async def _serve(config: MIAConfig) -> None:
    roles = RoleServer(config)
    memory = MemoryHandle(config.resolved_data_dir() / "memory", config.memory)
    agent = AgentHandle(config)
    encoders: list[Embedder] = []

    async def start() -> None:
        try:
            encoders.append(await asyncio.get_running_loop().run_in_executor(None, Embedder, config.memory.embedder))
        except Exception as err:
            log.error("the sentence encoder failed to load: %s", err)
        encoder = encoders[0] if encoders else None
        await memory.open(encoder)
        await roles.start()
        if encoder is not None and memory.is_ready() and roles.is_ready():
            await agent.start(roles, memory, encoder)

    async def stop() -> None:
        roles.shutdown()
        agent.close()
        await memory.close()
        for encoder in encoders:
            encoder.close()

    app = build_app(roles, config.server, start=start, stop=stop,
                    extra_routes=[*adapter_routes(roles.adapters), *memory_routes(memory)],  # type: ignore[arg-type]
                    components=[("memory_not_ready", memory), ("agent_not_ready", agent)], agent=agent)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, http="httptools", lifespan="on",
        log_level=config.server.log_level, access_log=config.server.access_log, timeout_graceful_shutdown=5,
        timeout_keep_alive=config.server.keep_alive_s))
    log.info("listening on http://%s:%d (memory, engines and agent start in the background; /health turns "
             "200 when ready)", config.server.host, config.server.port)
    await server.serve()


def serve(config: MIAConfig) -> None:
    uvloop.run(_serve(config))
