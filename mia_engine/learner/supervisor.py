"""The test-time learner's copy of the Planner, kept alive: in a process of its own or in this one
(``LearnerConfig.process``), its blocking calls on one dedicated thread, a process that dies replaced.

``LearnerSupervisor.call`` runs one of the learner's methods on that thread. When the learner's process
has died (``process.LearnerDied``: killed, out of memory), a fresh learner is built on the adapter
version served now (``restart_point``), its version counter kept (it counts accepted steps), and the
call is made once more unless it needs the dead learner's weights. A process that dies while no call
runs is noticed at once (its sentinel, watched on the event loop) and replaced the same way. After
``max_restarts`` deaths, or when a fresh learner fails to start, learning is off; ``health`` keeps the
count and the latest failure for ``/health``. Publishing is the caller's (``ttl.TestTimeLearner``): it
says where a fresh learner starts and what follows a restart (``after_restart``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ..config.learner import LearnerConfig
from ..devices import thread_binder
from ..engines.adapters import AdapterError, AdapterVersion
from .health import LearningHealth
from .learner import PlannerLearner
from .process import LearnerDied, LearnerProcess

log = logging.getLogger(__name__)

Learner = PlannerLearner | LearnerProcess
"""The learner in this process, or in its own (``LearnerConfig.process``): the same blocking calls."""


class LearnerSupervisor:
    """The current learner, its thread, and its replacement; used under the test-time learner's lock."""

    def __init__(self, config: LearnerConfig, lock: asyncio.Lock, tasks: set[asyncio.Task],
                 restart_point: Callable[[], AdapterVersion | None],
                 after_restart: Callable[[AdapterVersion], Awaitable[None]]) -> None:
        """``lock`` and ``tasks``: the caller's, held by every call and holding the background work;
        ``restart_point``: the version a fresh learner loads; ``after_restart``: what follows (numbering)."""
        self.config = config
        self.learner: Learner | None = None
        self.health = LearningHealth(config.max_restarts)
        # a learner process binds its own device: this thread only waits on its pipe, and binding it would
        # open a CUDA context in the serving process
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttl-learner", initializer=None
                                         if config.process == "spawn" else thread_binder(config.device, "learning"))
        self._lock, self._tasks = lock, tasks
        self._restart_point, self._after_restart = restart_point, after_restart
        self._base_dir: Path | None = None
        self._publish_dtype: torch.dtype | None = None
        self._watched: tuple[asyncio.AbstractEventLoop, LearnerProcess] | None = None
        """The learner process whose sentinel is watched, and the loop watching it."""
        self.is_closed = False

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the learner's thread."""
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    async def start(self, base_dir: Path, adapter_dir: Path, publish_dtype: torch.dtype | None) -> Learner:
        """The first learner, on ``adapter_dir``'s weights, publishing in ``publish_dtype``."""
        self._base_dir, self._publish_dtype = base_dir, publish_dtype
        self._install(await self.run(self._new, adapter_dir, None))
        assert self.learner is not None
        return self.learner

    async def rebuild(self, adapter_dir: Path) -> None:
        """A new learner on ``adapter_dir`` (another rank or other target modules), the version kept."""
        assert self.learner is not None
        fresh = await self.run(self._new, adapter_dir, self.learner.version)
        await self._drop(self.learner)
        self._install(fresh)

    async def call(self, method: str, *args: Any, retry: bool = True) -> Any:
        """The learner's ``method`` on its thread. A learner whose process died is replaced, then asked once
        more when ``retry`` (never a call that needs the dead one's weights: ``LearnerDied`` then)."""
        learner = self.learner
        if learner is None:
            raise AdapterError("test-time learning is off")
        try:
            return await self.run(getattr(learner, method), *args)  # looked up now: a diagnostic may wrap it
        except LearnerDied as err:
            await self._replace(learner, err)
            if not retry or self.learner is None:
                raise
        return await self.call(method, *args, retry=False)

    async def turn_off(self, failure: str) -> None:
        """No more updates: the served adapter stays, ``/health`` says why (``failure``: no paths in it)."""
        if self.learner is not None:
            await self._drop(self.learner)
        self.learner = None
        self.health.turned_off(failure)
        log.error("test-time learning is off: %s", failure)

    def stop(self) -> None:
        """Stop the learner now (its process: pipe closed, SIGKILL after a timeout); no replacement."""
        self._unwatch(self.learner)
        if isinstance(self.learner, LearnerProcess):
            self.learner.close()
        self.learner = None

    def close(self) -> None:
        self.is_closed = True
        self.thread.shutdown(wait=False, cancel_futures=True)
        self.stop()

    # ----- replacement ------------------------------------------------------------------------------

    def _new(self, adapter_dir: Path, version: int | None) -> Learner:
        """A learner on ``adapter_dir``'s weights at ``version`` (None: 0). Runs on the learner's thread."""
        kind = LearnerProcess if self.config.process == "spawn" else PlannerLearner
        learner = kind(self._base_dir, adapter_dir, self.config, self._publish_dtype)
        if self.is_closed and isinstance(learner, LearnerProcess):  # closed while it started: none may outlive it
            learner.close()
            raise LearnerDied("the test-time learner was closed")
        if version is not None:
            learner.version = version
        return learner

    async def _replace(self, dead: Learner, err: LearnerDied) -> None:
        """A fresh learner on the restart point for one whose process died, or learning off."""
        if dead is not self.learner:
            return  # replaced already
        if self.is_closed:  # stopped with the server: nothing to restart
            self.learner = None
            return
        log.error("test-time learning: %s", err)
        served = self._restart_point()
        if not self.health.can_restart or served is None:
            await self.turn_off(f"{err} (restarted {self.health.num_restarts} times before)")
            return
        await self._drop(dead)
        self.health.restarted(str(err))
        try:
            self._install(await self.run(self._new, served.path, dead.version))
            await self._after_restart(served)
        except Exception as build_err:
            log.error("a fresh learner failed to start: %s", build_err)
            await self.turn_off(f"{err}; a fresh learner failed to start ({type(build_err).__name__})")
            return
        log.warning("test-time learning goes on from %s@v%d (restart %d of %d, %s, v%d)", served.role,
                    served.version, self.health.num_restarts, self.config.max_restarts, where(self.learner),
                    self.learner.version)

    def _install(self, learner: Learner) -> None:
        """Make ``learner`` the current one; a learner process is replaced as soon as it dies, even while
        no call runs."""
        self.learner = learner
        if isinstance(learner, LearnerProcess):
            loop = asyncio.get_running_loop()
            loop.add_reader(learner.sentinel, self._on_exit, learner)
            self._watched = (loop, learner)

    def _unwatch(self, learner: Learner | None) -> None:
        """Stop watching ``learner``'s sentinel, before its process closes it (the fd number may be reused)."""
        if self._watched is not None and self._watched[1] is learner:
            loop, _ = self._watched
            self._watched = None
            if not loop.is_closed():
                loop.remove_reader(learner.sentinel)

    def _on_exit(self, learner: LearnerProcess) -> None:
        self._unwatch(learner)
        if learner is self.learner and not self.is_closed:
            task = asyncio.ensure_future(self._recover(learner))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _recover(self, learner: LearnerProcess) -> None:
        async with self._lock:  # a call that met the death replaced it already
            if learner is self.learner:
                await self._replace(learner, learner.died())

    async def _drop(self, learner: Learner) -> None:
        """Stop watching ``learner`` and stop its process, if it has one."""
        if isinstance(learner, LearnerProcess):
            self._unwatch(learner)
            await asyncio.get_running_loop().run_in_executor(None, learner.close)


def where(learner: Learner) -> str:
    """Where ``learner`` runs, for the log."""
    return f"process {learner.pid}" if isinstance(learner, LearnerProcess) else "in process"
