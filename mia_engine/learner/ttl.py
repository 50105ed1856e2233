"""Online test-time learning (MIA.md, "Test-time learning" step 7): GRPO updates of the Planner's
LoRA adapter between batches, published to the serving engine without stopping it.

Learning requests hand their judged rollout groups here; once ``batch_size`` groups are gathered, one
update runs off the event loop (a dedicated thread), the new weights are written to a fresh folder
(tmpfs when there is one) and published through the adapter registry: requests already running finish
on the old version, new ones get the new one. An update that is non-finite, or an adapter the engine
will not load, is rejected and the previous version keeps serving. Good versions are checkpointed
under the data dir, so a restart resumes from the latest and ``rollback`` can return to the previous.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import torch

from ..engines.adapters import AdapterError, AdapterRegistry
from .checkpoints import AdapterCheckpoints, prune_published, publish_dir, publish_path
from .config import LearnerConfig
from .learner import GRPOSample, PlannerLearner, StepResult

log = logging.getLogger(__name__)


class UpdateReport(msgspec.Struct):
    """One update as the operator (and the TTL metrics file) sees it."""

    step: StepResult
    is_published: bool
    reason: str
    """Why nothing was published (empty when it was)."""
    adapter_version: int | None
    """The registry version serving after the update."""
    publish_seconds: float
    """Optimizer step end → the new version serves new requests (save + engine load + switch)."""


class TestTimeLearner:
    """Gathers rollout groups, updates and publishes the Planner (one update at a time)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, config: LearnerConfig, registry: AdapterRegistry, checkpoint_root: Path,
                 role: str = "planner", on_update: Any = None) -> None:
        self.config = config
        self.registry = registry
        self.role = role
        self.checkpoints = AdapterCheckpoints(checkpoint_root, config.num_checkpoints_kept)
        self._publish_root = publish_dir(config)
        self._learner: PlannerLearner | None = None
        self._pending: list[list[GRPOSample]] = []
        self._lock = asyncio.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttl-learner")
        self._tasks: set[asyncio.Task] = set()
        self.on_update = on_update
        """Called with every ``UpdateReport`` (metrics, the ttl command's metrics file)."""
        self.reports: list[UpdateReport] = []

    def resume_path(self) -> Path | None:
        """The latest good checkpoint to serve at startup (None: the configured adapter)."""
        return self.checkpoints.latest()

    async def start(self, base_dir: Path) -> None:
        """Load the trainable copy of the Planner from the adapter version now serving."""
        current = self.registry.current(self.role)
        if current is None:
            raise AdapterError(f"role {self.role!r} has no adapter to learn")
        loop = asyncio.get_running_loop()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self._learner = await loop.run_in_executor(self._thread, PlannerLearner, base_dir, current.path, self.config)
        if self.checkpoints.latest_version() is None:  # the starting point is the first rollback target
            await loop.run_in_executor(self._thread, self.checkpoints.save, 0, current.path)
        log.info("test-time learner ready on %s (%s, lr %g, batch %d groups)", self.role, self.config.device,
                 self.config.lr, self.config.batch_size)

    @property
    def is_ready(self) -> bool:
        return self._learner is not None

    async def submit(self, group: list[GRPOSample]) -> None:
        """Queue one question's rollouts; a full batch starts an update in the background."""
        self._pending.append(group)
        if len(self._pending) >= self.config.batch_size:
            batch, self._pending = self._pending, []
            task = asyncio.ensure_future(self.update([s for g in batch for s in g]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Update on a partial batch too, and wait for every update in flight (end of a TTL epoch)."""
        if self._pending:
            batch, self._pending = self._pending, []
            await self.update([s for g in batch for s in g])
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def update(self, samples: list[GRPOSample]) -> UpdateReport:
        """One GRPO step, then publish + checkpoint, or reject and keep serving the old version."""
        if self._learner is None:
            raise AdapterError("the test-time learner is not loaded")
        async with self._lock:
            loop = asyncio.get_running_loop()
            step = await loop.run_in_executor(self._thread, self._learner.step, samples)
            report = await self._publish(step) if step.is_accepted else UpdateReport(
                step, False, step.reason, self._live_version(), 0.0)
        self._record(report)
        return report

    async def _publish(self, step: StepResult) -> UpdateReport:
        assert self._learner is not None
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        path = publish_path(self._publish_root, self.role, step.version)
        await loop.run_in_executor(self._thread, self._learner.save_adapter, path)
        previous = self.registry.current(self.role)
        try:
            version = await self.registry.publish(self.role, path)
        except AdapterError as err:
            if previous is not None:  # the learner goes back to what is serving
                await loop.run_in_executor(self._thread, self._learner.load_adapter_weights, previous.path)
            return UpdateReport(step, False, f"the engine refused the new adapter: {err}", self._live_version(),
                                time.perf_counter() - start)
        seconds = time.perf_counter() - start
        await loop.run_in_executor(self._thread, self._checkpoint, step.version, path)
        return UpdateReport(step, True, "", version.version, seconds)

    def _checkpoint(self, learner_version: int, path: Path) -> None:
        self.checkpoints.save(learner_version, path)
        self.checkpoints.mark_good(learner_version)
        prune_published(path.parent, self.config.num_checkpoints_kept + 1)

    async def rollback(self) -> int:
        """Serve (and continue learning from) the checkpoint before the latest good one."""
        if self._learner is None:
            raise AdapterError("the test-time learner is not loaded")
        async with self._lock:
            latest = self.checkpoints.latest_version()
            previous = self.checkpoints.previous(latest) if latest is not None else None
            if previous is None:
                raise AdapterError("no earlier adapter version to roll back to")
            version = await self.registry.publish(self.role, previous)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._thread, self._learner.load_adapter_weights, previous)
            target = int(previous.name.lstrip("v"))
            self.checkpoints.mark_good(target)
            for newer in [v for v in self.checkpoints.versions() if v > target]:  # rolled back: not good
                shutil.rmtree(self.checkpoints.path(newer), ignore_errors=True)
            log.warning("rolled %s back to checkpoint %s (now %s@v%d)", self.role, previous.name, self.role,
                        version.version)
            return version.version

    def _live_version(self) -> int | None:
        current = self.registry.current(self.role)
        return current.version if current else None

    def _record(self, report: UpdateReport) -> None:
        self.reports.append(report)
        if report.is_published:
            log.info("GRPO update published: %s@v%s (loss %.4g, reward %.3f±%.3f, step %.2fs, swap %.1f ms)",
                     self.role, report.adapter_version, report.step.loss, report.step.reward_mean,
                     report.step.reward_std, report.step.step_seconds, report.publish_seconds * 1e3)
        else:
            log.warning("GRPO update rejected: %s; %s keeps serving v%s", report.reason, self.role,
                        report.adapter_version)
        if self.on_update is not None:
            self.on_update(report)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._thread.shutdown(wait=False, cancel_futures=True)


def rollout_samples(rollouts: list[Any], group_id: str) -> list[GRPOSample]:
    """GRPO samples of one question's judged rollouts: per rollout, the Planner's tokens as sampled (plan,
    reflection, replan; template turns and everything else masked out) and the rollout's reward."""
    return [GRPOSample(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, completion_mask=t.completion_mask,
                       reward=r.reward, group_id=group_id)
            for r in rollouts if (t := r.trajectory.planner) is not None]


async def planner_samples(client: Any, model: str, plan_messages: list[dict[str, str]], plans: list[str],
                          rewards: list[float], group_id: str) -> list[GRPOSample]:
    """GRPO samples of plans scored outside the server (``POST /v1/adapters/{role}/grpo``): the Planner's
    prompt and the plan texts, tokenized here since the caller has text only."""
    prompt_ids = await client.render_chat(model, plan_messages)
    return [GRPOSample(prompt_ids=prompt_ids, completion_ids=await client.encode(model, plan), reward=reward,
                       group_id=group_id)
            for plan, reward in zip(plans, rewards) if plan]
