"""The composition root: one object builds everything behind the HTTP app (the platform, the engines and
their roles, the sentence encoders, the memory store, the research agent's tools, the test-time learner,
the research agent, the metrics and the admission bounds), starts it in order (``Services.start``),
stops it together, and hands the HTTP app all of it as one ``AppParts`` (``app_parts``).

The server (``serve.py``) starts them after it listens; the batch commands (``batch.py``, ``evaluate.py``)
run them in-process, with no HTTP, through ``with_services``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .agent.handle import AgentHandle
from .agent.records import Rollout
from .base.files import UnsafeFolder, private_dir
from .config import MIAConfig, resolve_role
from .engines.adapter_staging import STAGING_DIR, AdapterStaging
from .engines.lora_models import RuntimeLoRAs
from .engines.platforms import resolve_platform
from .engines.roles import RoleServer
from .engines.startup import cuda_components
from .learner.model import UntrainableBase
from .learner.ttl import TestTimeLearner, rollout_samples
from .memory.embedder import Embedder
from .memory.handle import MemoryHandle
from .server.admission import Admission
from .server.app import AppParts
from .server.metrics import Metrics
from .tools.corpus import index_root
from .tools.image import ImageSearch
from .tools.image_index import load_image_index
from .tools.registry import Tools
from .tools.search import LocalSearch
from .tools.web import WebSearch

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5
"""How often ``run_until_failure`` looks at the engines: an engine's death is known to vLLM within a
second (its monitor thread waits on the engine-core process), so the server exits within seconds."""


class Services:
    """Everything behind the HTTP app, started in order once the server listens."""

    def __init__(self, config: MIAConfig, *, learns: bool = True) -> None:
        """``learns``: start the test-time learner (False for work that never learns, such as an evaluation
        pass: no learner process to start, and no copy of the Planner in memory)."""
        self.config = config
        self.learns = learns
        self.metrics = Metrics()
        self.admission = Admission(config.server.admission)
        self.platform = resolve_platform(config.cpu)
        self.roles = RoleServer(config, self.platform)
        self.roles.usage = self.metrics
        self.loras = RuntimeLoRAs(self.roles)
        self.metrics.watch_engines(self.roles.engines)
        data_dir = private_dir(config.resolved_data_dir(), "data_dir")  # UnsafeFolder: another user's
        self.roles.adapters.staging = AdapterStaging(data_dir / STAGING_DIR)  # copies of request-named adapters
        self.memory = MemoryHandle(data_dir / "memory", config.memory)
        self.agent = AgentHandle(config, stages=self.metrics)
        planner = config.agent.roles.planner
        self.learner = TestTimeLearner(config.learner, self.roles.adapters,
                                       data_dir / "adapters" / planner, planner,
                                       on_update=self._after_update)
        self.encoders: list[Embedder] = []
        """The memory's sentence encoder, and the tools' where theirs is another model."""
        self._search: LocalSearch | None = None
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
        tools = asyncio.ensure_future(self._prepare_tools(encoder)) if encoder is not None else None
        if not is_engines_first:
            await self.roles.start()
        if tools is not None:
            await tools
        if not (encoder is not None and self.memory.is_ready() and self.roles.is_ready()):
            return
        self.platform.after_engines_up()  # after the passage index, whose build uses every core
        if self.learns:
            await self._start_learner()
        else:
            log.info("test-time learning off: nothing here learns")
        await self.agent.start(self.roles, self.memory.service, self._learn if self.learner.is_ready else None)
        from vllm.utils.gc_utils import freeze_gc_heap, maybe_attach_gc_debug_callback

        freeze_gc_heap()  # as vllm serve does once up: full collections then skip the models' and libraries' objects
        maybe_attach_gc_debug_callback()  # VLLM_GC_DEBUG logs each collection here too, as in vLLM's engine core

    async def _prepare_tools(self, encoder: Embedder) -> None:
        """The research agent's tools, built while the engines start (the passage index build is most of a
        first start); a failure is the agent's to report."""
        try:
            self.agent.prepared(await self._build_tools(encoder))
        except Exception as err:
            self.agent.tools_failed(err)

    async def _build_tools(self, encoder: Embedder) -> Tools:
        """Local search over the configured corpus (index built once, cached), web and image search."""
        config, loop = self.config.tools, asyncio.get_running_loop()
        if config.embedder != self.config.memory.embedder:
            encoder = await loop.run_in_executor(None, Embedder, config.embedder)
            self.encoders.append(encoder)
        if config.search_backend == "local":
            self._search = await loop.run_in_executor(None, LocalSearch.from_config, config, encoder,
                                                      index_root(self.config), True, self.agent.index_progress)
        web = WebSearch(config) if config.is_web_enabled else None
        local_images = await loop.run_in_executor(None, load_image_index, self.config)
        image = (ImageSearch(config.image_cache_dir, config.image_top_k, local_images)
                 if config.image_cache_dir or local_images is not None else None)
        return Tools(config, local=self._search, web=web, image=image)

    def app_parts(self, start: Callable[[], Awaitable[None]]) -> AppParts:
        """What the HTTP app serves; ``start`` brings these services up once the server listens."""
        return AppParts(
            client=self.roles, config=self.config.server, admission=self.admission, metrics=self.metrics,
            readiness=[("memory_not_ready", self.memory), ("agent_not_ready", self.agent),
                       ("learning", self.learner.health)], agent=self.agent,
            encoder=lambda: self.encoders[0] if self.encoders else None, learner=self.learner,
            adapters=self.roles.adapters, adapter_dirs=adapter_load_dirs(self.config), loras=self.loras,
            planner=self.config.agent.roles.planner, memory=self.memory, start=start, stop=self.stop)

    def start_failure(self) -> str | None:
        """After ``start``: the first component that did not start and why, in one line (None: all up)."""
        for name, component in (("engines", self.roles), ("memory", self.memory), ("agent", self.agent)):
            if not component.is_ready():
                return f"{name} did not start: {component.not_ready_reason()}"
        return None

    async def run_until_failure(self) -> str:
        """Start, then watch the engines: returns the one-line cause once an engine failed to start or
        died, or (the start done) any component did not start; runs until cancelled while all is well.
        The server exits on the answer, as ``vllm serve`` does, rather than answer 503 for good."""
        starting = asyncio.ensure_future(self.start())
        try:
            while True:
                if starting.done():
                    await asyncio.sleep(WATCH_INTERVAL_S)
                else:
                    await asyncio.wait([starting], timeout=WATCH_INTERVAL_S)
                cause = self.roles.failure()
                if cause is None and starting.done():
                    cause = _start_error(starting) or self.start_failure()
                if cause is not None:
                    return cause
        finally:
            if not starting.done():
                starting.cancel()

    async def _start_learner(self) -> None:
        role = self.learner.role
        if self.roles.adapters.current(role) is None:
            log.info("test-time learning off: role %s has no adapter", role)
            return
        engine = self.roles.engines[resolve_role(self.config, role)[1].engine]
        try:
            await self.learner.start(engine.model_dir, engine.dtype, engine.config.quantization)
        except (UntrainableBase, UnsafeFolder) as err:
            log.error("test-time learning off: %s", err)
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
            result = await self.memory.service.clear_after_update()
        except Exception:
            log.exception("clearing the memory after an update failed")
            return
        log.info("memory cleared after the update (%s): %s", self.config.memory.clear_policy, result)

    async def _learn(self, rollouts: list[Rollout]) -> None:
        samples = rollout_samples(rollouts, uuid.uuid4().hex)
        if samples:  # a question whose plans came back empty has nothing to learn from
            await self.learner.submit(samples)

    async def stop(self) -> None:
        """Stop every component, then undo ``start``'s GC freeze, as vLLM's engine core does at its
        shutdown: frozen objects are never collected, and reference cycles among them (classes and their
        methods) would outlive the interpreter's teardown, which native bindings report as leaks."""
        self.learner.close()
        self.roles.shutdown()
        if self.roles.adapters.staging is not None:
            self.roles.adapters.staging.close()
        if self._search is not None:
            self._search.close()
        await self.memory.close()
        for encoder in self.encoders:
            encoder.close()
        gc.unfreeze()


def adapter_load_dirs(config: MIAConfig) -> list[Path]:
    """The folders ``POST /v1/adapters/{role}`` and ``/v1/load_lora_adapter`` may load from: the data dir's
    adapters folder (the learner's checkpoints and versions), ``learner.publish_dir`` and ``server.adapter_dirs``. Not
    ``learner.shared_dirs``: those are shared mounts, named for the cluster's reach, not for trust."""
    learner_dir = [config.learner.publish_dir] if config.learner.publish_dir else []
    return [config.resolved_data_dir() / "adapters",
            *(Path(folder).expanduser() for folder in [*learner_dir, *config.server.adapter_dirs])]


def _start_error(starting: asyncio.Future) -> str | None:
    """Why a finished ``Services.start`` raised (None: it returned; a failure it kept is a component's)."""
    if starting.cancelled():
        return "the start was cancelled"
    error = starting.exception()
    if error is not None:
        log.error("the start failed", exc_info=error)
        return f"the start failed: {type(error).__name__}: {error}"
    return None


async def with_services(config: MIAConfig, work: Any, *, learns: bool = True) -> Any:
    """Start the services (``learns``: with the test-time learner), check each component, run
    ``work(services)``, stop (a failure is one line)."""
    services = Services(config, learns=learns)
    await services.start()
    try:
        failure = services.start_failure()
        if failure is not None:
            raise SystemExit(f"python -m mia_engine: error: {failure}")
        return await work(services)
    finally:
        await services.stop()
