"""The one serving process: uvloop, the HTTP app, and behind it the shared encoder, the memory store,
the engines, the test-time learner and the research agent, which start after the server listens
(``/health`` answers 503 until they are up)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import uvicorn
import uvloop

from .agent.handle import AgentHandle
from .agent.protocol import Rollout
from .config import MIAConfig, resolve_role
from .engines.roles import RoleServer
from .engines.startup import cuda_components
from .learner.ttl import TestTimeLearner, rollout_samples
from .memory.embedder import Embedder
from .memory.handle import MemoryHandle
from .server.adapters_api import adapter_routes
from .server.admission import Admission
from .server.app import build_app
from .server.learner_api import learner_routes
from .server.memory_api import memory_routes
from .server.metrics import Metrics

log = logging.getLogger(__name__)


class Services:
    """Everything behind the HTTP app, started in order once the server listens."""

    def __init__(self, config: MIAConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.roles = RoleServer(config)
        self.memory = MemoryHandle(config.resolved_data_dir() / "memory", config.memory)
        self.agent = AgentHandle(config)
        planner = config.agent.roles.planner
        self.learner = TestTimeLearner(config.learner, self.roles.adapters,
                                       config.resolved_data_dir() / "adapters" / planner, planner,
                                       on_update=self._after_update)
        self.encoders: list[Embedder] = []
        self._background: set[asyncio.Future] = set()

    async def start(self) -> None:
        """Encoder and memory first; then the passage index builds while the model converts and the
        engines start (on a first start the two take about as long); the learner and the agent last,
        since the learner lowers torch's thread count for threads started after it. When anything in
        this process uses CUDA (encoder, index, learner), the engines start first instead: vLLM must
        start its workers before this process initialises CUDA (engines/startup.py)."""
        resume = self.learner.resume_path()
        if resume is not None:
            log.info("resuming %s from its latest learned checkpoint %s", self.learner.role, resume)
            self.roles.initial_adapters[self.learner.role] = resume
        is_engines_first = bool(cuda_components(self.config))
        if is_engines_first:
            await self.roles.start()
        try:
            loop = asyncio.get_running_loop()
            self.encoders.append(await loop.run_in_executor(None, Embedder, self.config.memory.embedder))
        except Exception as err:
            log.error("the sentence encoder failed to load: %s", err)
            self.agent.fail(f"the sentence encoder failed to load: {type(err).__name__}")
        encoder = self.encoders[0] if self.encoders else None
        await self.memory.open(encoder)
        tools = asyncio.ensure_future(self.agent.prepare(encoder)) if encoder is not None else None
        if not is_engines_first:
            await self.roles.start()
        if tools is not None:
            await tools
        if not (encoder is not None and self.memory.is_ready() and self.roles.is_ready()):
            return
        await self._start_learner()
        await self.agent.start(self.roles, self.memory, self._learn if self.learner.is_ready else None)

    async def _start_learner(self) -> None:
        role = self.learner.role
        if self.roles.adapters.current(role) is None:
            log.info("test-time learning off: role %s has no adapter", role)
            return
        engine = self.roles.engines[resolve_role(self.config, role)[1].engine]
        try:
            await self.learner.start(engine.model_dir, engine.config.dtype)
        except Exception:
            log.exception("test-time learning off: the learner failed to load")

    def _after_update(self, report: Any) -> None:
        """Every learner update: metrics, and after a published one the memory's selective clearing
        (``memory.clear_policy``; paper: the buffer is cleared after each update so it doesn't saturate)."""
        self.metrics.record_update(report)
        if report.is_published and self.memory.is_ready():
            task = asyncio.ensure_future(self._clear_memory())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _clear_memory(self) -> None:
        try:
            result = await self.memory.clear_after_update()
        except Exception:
            log.exception("clearing the memory after an update failed")
            return
        log.info("memory cleared after the update (%s): %s", self.config.memory.clear_policy, result)

    async def _learn(self, rollouts: list[Rollout]) -> None:
        samples = rollout_samples(rollouts, uuid.uuid4().hex)
        if samples:  # a question whose plans came back empty has nothing to learn from
            await self.learner.submit(samples)

    async def stop(self) -> None:
        self.learner.close()
        self.roles.shutdown()
        self.agent.close()
        await self.memory.close()
        for encoder in self.encoders:
            encoder.close()


async def _serve(config: MIAConfig) -> None:
    services = Services(config)
    admission = Admission(config.server.admission)
    routes = [*learner_routes(services.learner, services.roles, config.server, admission),
              *adapter_routes(services.roles.adapters, config.server, admission),
              *memory_routes(services.memory, config.server, admission)]  # type: ignore[arg-type]
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
    uvloop.run(_serve(config))
