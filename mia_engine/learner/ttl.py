"""Online test-time learning (MIA.md, "Test-time learning" step 7): GRPO updates of the Planner's
LoRA adapter between batches, published to the serving engine without stopping it.

Learning requests hand their judged rollout groups here; once ``batch_size`` groups are gathered, one
update runs off the event loop (a dedicated thread), the new weights are written to a fresh folder
(under the data dir, or a private tmpfs folder: ``checkpoints.publish_dir``) in the engine's dtype and
published through the adapter registry: requests already running finish
on the old version, new ones get the new one. An update that is non-finite, or one whose save or load
fails, is rejected: the previous version keeps serving and the learner returns to it. An operator's
adapter published to the role becomes the learner's starting point. Good versions are checkpointed
under the data dir, so a restart resumes from the latest and ``rollback`` can return to the previous.

The learner runs in a process of its own by default (``learner.process``: ``process.LearnerProcess``),
or in this one; either way its blocking calls run on a dedicated thread (``supervisor.LearnerSupervisor``),
and the rest reads the same. A learner process that dies (killed, out of memory) is replaced by a fresh
one on the version served; an update it died in runs its batch once more on the fresh one, so no
acknowledged sample is lost. After ``max_restarts`` deaths learning is off; serving goes on either way,
and ``/health`` reports it (``health.LearningHealth``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
import torch

from ..engines.adapters import AdapterError, AdapterRegistry, AdapterVersion
from .batching import GrammarSpan, GRPOSample
from .checkpoints import AdapterCheckpoints, prune_published, publish_dir, publish_path, remove_staging
from ..config.learner import LearnerConfig
from .process import LearnerDied
from .step_result import StepResult, StepSummary
from .supervisor import Learner, LearnerSupervisor, where
from .model import check_trainable_base

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
    num_learner_restarts: int = 0
    """Times the learner's process died during this update and a fresh one took over."""


class TestTimeLearner:
    """Gathers rollout groups, updates and publishes the Planner (one update at a time)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, config: LearnerConfig, registry: AdapterRegistry, checkpoint_root: Path,
                 role: str = "planner", on_update: Any = None) -> None:
        self.config = config
        self.registry = registry
        self.role = role
        self.checkpoints = AdapterCheckpoints(checkpoint_root, config.num_checkpoints_kept)
        self._data_publish_root = Path(checkpoint_root).parent / "published"
        self._publish_root: Path | None = None  # chosen at start, once the adapter's size is known
        self._based_on: Path | None = None
        """The served adapter folder the learner's weights started from (its updates build on it)."""
        self._own_paths: set[Path] = set()
        self._pending: list[list[GRPOSample]] = []
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._supervisor = LearnerSupervisor(config, self._lock, self._tasks, lambda: registry.current(role),
                                         self._after_restart)
        self.health = self._supervisor.health
        """The learner's deaths and restarts, for ``/health``."""
        self.on_update = on_update
        """Called with every ``UpdateReport`` (metrics, the ttl command's metrics file)."""
        self.reports: deque[UpdateReport] = deque(maxlen=config.num_reports_kept)
        """The latest updates (``LearnerConfig.num_reports_kept``)."""
        registry.on_publish(self._on_publish)

    def resume_path(self) -> Path | None:
        """The latest good checkpoint to serve at startup (None: the configured adapter)."""
        return self.checkpoints.latest()

    async def start(self, base_dir: Path, engine_dtype: str = "auto", quantization: str | None = None) -> None:
        """Load the trainable copy of the Planner from the adapter version now serving; adapters are
        published in ``engine_dtype`` (the serving engine's; ``auto`` = the base model's). A quantised base
        (the engine's ``quantization``, or the model's own config) is refused: ``UntrainableBase``."""
        current = self.registry.current(self.role)
        if current is None:
            raise AdapterError(f"role {self.role!r} has no adapter to learn")
        check_trainable_base(Path(base_dir), quantization)
        async with self._lock:  # a learner process that dies meanwhile is replaced after the start
            try:
                await self._start(current, Path(base_dir), engine_dtype)
            except BaseException:  # learning is off: no learner (nor its process) is left behind
                self._supervisor.stop()
                raise

    async def _start(self, current: AdapterVersion, base_dir: Path, engine_dtype: str) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        learner = await self._supervisor.start(base_dir, current.path, serving_dtype(base_dir, engine_dtype))
        self._publish_root = publish_dir(self.config, self._data_publish_root, learner.adapter_num_bytes)
        remove_staging(self._publish_root / self.role)  # what a killed process was writing
        await self._supervisor.run(self._continue_numbering, current.path, self._served_paths(), 0)
        self._based_on = current.path
        log.info("test-time learner ready on %s (%s, %s, lr %g, batch %d groups, v%d, publishing to %s)", self.role,
                 self.config.device, where(learner), self.config.lr, self.config.batch_size, learner.version,
                 self._publish_root)

    async def _after_restart(self, served: AdapterVersion) -> None:
        """A fresh learner runs on ``served``: an operator's adapter not adopted yet is checkpointed as
        ``_adopt`` does; what the dead learner was writing goes."""
        if served.path != self._based_on:
            await self._supervisor.run(self._continue_numbering, served.path, self._served_paths(),
                                   self._supervisor.learner.version + 1)
        self._based_on = served.path
        if self._publish_root is not None:
            remove_staging(self._publish_root / self.role)

    def _continue_numbering(self, served: Path, protected: set[Path], at_least: int) -> None:
        """Versions continue from the checkpoints on disk; a served adapter that is not the latest good
        checkpoint (first start, an operator's) is checkpointed as the next version: the rollback target."""
        assert self._learner is not None
        latest = self.checkpoints.latest()
        if latest is not None and latest.resolve() == served.resolve():
            self._learner.version = self.checkpoints.next_version() - 1
            return
        version = max(self.checkpoints.next_version(), at_least)
        self.checkpoints.save(version, served, protected)
        self._learner.version = version

    def _served_paths(self) -> set[Path]:
        """Folders of the role's live and draining versions: never pruned."""
        return {v.path for v in self.registry.versions() if v.role == self.role}

    @property
    def _learner(self) -> Learner | None:
        return self._supervisor.learner

    @property
    def is_ready(self) -> bool:
        return self._learner is not None

    @property
    def planner_learner(self) -> Learner | None:
        """The trainable copy of the Planner (None until started, or once learning is off), for diagnostics
        that score samples under its weights (``token_logprobs``; blocking calls: make them on the thread
        that runs ``step``, as a wrapper of ``step`` does)."""
        return self._learner

    async def submit(self, group: list[GRPOSample]) -> None:
        """Queue one question's rollouts; a full batch starts an update in the background, after waiting
        while ``max_queued_updates`` are already queued (the backlog stays bounded). Once learning is off
        after a failure (``health``), the groups are not kept."""
        if self.health.is_off:
            return
        self._pending.append(group)
        if len(self._pending) < self.config.batch_size:
            return
        batch, self._pending = self._pending, []
        while len(self._tasks) >= self.config.max_queued_updates:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.ensure_future(self.update([s for g in batch for s in g]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Update on a partial batch too, and wait for every update in flight (end of a TTL epoch)."""
        if self._pending and not self.health.is_off:
            batch, self._pending = self._pending, []
            await self.update([s for g in batch for s in g])
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def update(self, samples: list[GRPOSample]) -> UpdateReport:
        """One GRPO step, then publish + checkpoint, or reject and keep serving the old version."""
        if self._learner is None:
            raise AdapterError("the test-time learner is not loaded")
        async with self._lock:
            num_restarts = self.health.num_restarts
            report = await self._update(samples)
            report.num_learner_restarts = self.health.num_restarts - num_restarts
        self._record(report)
        return report

    async def _update(self, samples: list[GRPOSample]) -> UpdateReport:
        """Step, then publish; a learner that dies on the way is replaced (``LearnerSupervisor``) and the batch
        runs once more on the fresh one: the samples were acknowledged to their requests."""
        failure = "test-time learning is off"
        for _ in range(2):
            if self._learner is None:
                break
            try:
                step = await self._supervisor.call("step", samples, self._live_version(), retry=False)
                return await self._publish(step) if step.is_accepted else UpdateReport(
                    step, False, step.reason, self._live_version(), 0.0)
            except LearnerDied as err:
                failure = f"{err}; " + ("learning is off" if self._learner is None else "it died on this batch twice")
        version = self._learner.version if self._learner is not None else self.checkpoints.latest_version() or 0
        return UpdateReport(StepSummary(torch.zeros(0), time.perf_counter()).rejected(failure, version), False,
                            failure, self._live_version(), 0.0)

    async def _publish(self, step: StepResult) -> UpdateReport:
        """Save, load into the engine, switch; on any failure the learner goes back to what is served."""
        assert self._learner is not None and self._publish_root is not None
        start = time.perf_counter()
        served = self.registry.current(self.role)
        if served is not None and served.path != self._based_on:  # an operator published meanwhile
            await self._adopt(served.path)
            return UpdateReport(step, False, f"{served.path} was published during the update; the learner "
                                "continues from it", self._live_version(), time.perf_counter() - start)
        try:
            path = publish_path(self._publish_root, self.role, step.version)
            await self._supervisor.call("save_adapter", path, retry=False)  # a fresh learner lacks the step
            version = await self._publish_own(path)
        except LearnerDied:  # replaced already: the update runs the batch again on the fresh learner
            raise
        except Exception as err:  # a full disk, a refused adapter, an engine error: nothing may drift
            reason = f"publishing failed ({type(err).__name__}: {err}); " + await self._back_to(served)
            return UpdateReport(step, False, reason, self._live_version(), time.perf_counter() - start)
        seconds = time.perf_counter() - start
        try:
            await self._supervisor.run(self._checkpoint, step.version, path, self._served_paths())
        except Exception as err:  # serving and learner agree; only the durable copy is missing
            log.error("checkpoint of %s v%d failed (%s): serving it without a durable copy", self.role,
                      step.version, err)
        return UpdateReport(step, True, "", version.version, seconds)

    async def _publish_own(self, path: Path) -> AdapterVersion:
        self._own_paths.add(path.resolve())
        try:
            version = await self.registry.publish(self.role, path)
        finally:
            self._own_paths.discard(path.resolve())
        self._based_on = version.path
        return version

    async def _back_to(self, served: AdapterVersion | None) -> str:
        """Reset the learner to the served version's weights; learning stops if even that fails."""
        assert self._learner is not None
        if served is None:
            return "nothing is served to return to"
        try:
            await self._supervisor.call("load_adapter_weights", served.path)
        except Exception as err:
            log.error("the learner cannot return to %s (%s)", served.path, err)
            if self._learner is not None:
                await self._supervisor.turn_off(
                    f"the learner could not return to the served version ({type(err).__name__})")
            return f"the learner could not return to the served version ({err}); learning is off"
        self._based_on = served.path
        return f"the learner is back on the served version {self.role}@v{served.version}"

    def _checkpoint(self, learner_version: int, path: Path, protected: set[Path]) -> None:
        self.checkpoints.save(learner_version, path, protected)
        prune_published(path.parent, self.config.num_checkpoints_kept + 1, protected)

    async def _on_publish(self, version: AdapterVersion) -> None:
        """An operator's adapter (``POST /v1/adapters/{role}``) becomes the learner's starting point (read from
        ``version.path``: the registry's checked copy of the operator's folder)."""
        if version.role != self.role or version.path.resolve() in self._own_paths or self._learner is None:
            return
        task = asyncio.ensure_future(self._adopt_locked(version))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _adopt_locked(self, version: AdapterVersion) -> None:
        async with self._lock:  # a version replaced meanwhile is skipped: its copy goes once it drains
            if self._learner is not None and not version.is_retired and version.path != self._based_on:
                await self._adopt(version.path)

    async def _adopt(self, path: Path) -> None:
        """Continue learning from ``path`` (served now), checkpointed as the next version."""
        assert self._learner is not None
        try:
            await self._supervisor.call("load_adapter_weights", path)
        except ValueError:  # another rank or other target modules: a learner built on it
            await self._supervisor.rebuild(path)
        assert self._learner is not None
        self._based_on = path
        await self._supervisor.run(self._continue_numbering, path, self._served_paths(), self._learner.version + 1)
        log.info("the learner continues from the operator's adapter %s (v%d)", path, self._learner.version)

    async def rollback(self) -> int:
        """Serve (and continue learning from) the checkpoint before the latest good one."""
        if self._learner is None:
            raise AdapterError("the test-time learner is not loaded")
        async with self._lock:
            latest = self.checkpoints.latest_version()
            previous = self.checkpoints.previous(latest) if latest is not None else None
            if previous is None:
                raise AdapterError("no earlier adapter version to roll back to")
            served = self.registry.current(self.role)
            await self._supervisor.call("load_adapter_weights", previous)
            try:
                version = await self._publish_own(previous)
            except Exception:
                await self._back_to(served)
                raise
            target = int(previous.name.lstrip("v"))
            self.checkpoints.mark_good(target)
            protected = {p.resolve() for p in self._served_paths()}
            for newer in [v for v in self.checkpoints.versions() if v > target]:  # rolled back: not good
                if self.checkpoints.path(newer).resolve() not in protected:
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
        """Cancel the updates and stop the learner (its process too)."""
        for task in self._tasks:
            task.cancel()
        self._supervisor.close()


def serving_dtype(base_dir: Path, engine_dtype: str) -> torch.dtype:
    """The engine's dtype as torch's: its config value, or for ``auto`` the model's ``torch_dtype``."""
    name = engine_dtype
    if name == "auto":
        config = json.loads((base_dir / "config.json").read_text())
        name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype = getattr(torch, {"half": "float16", "float": "float32"}.get(name, name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown engine dtype {engine_dtype!r}")
    return dtype


def rollout_samples(rollouts: list[Any], group_id: str) -> list[GRPOSample]:
    """GRPO samples of one question's judged rollouts: per rollout, the Planner's tokens as sampled (plan,
    reflection, replan; template turns and everything else masked out), the sampler's log-prob of each,
    the spans written under a regex, the adapter version that sampled them, and the rollout's reward."""
    return [GRPOSample(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, completion_mask=t.completion_mask,
                       old_logprobs=t.logprobs, policy_version=t.policy_version,
                       grammar_spans=[GrammarSpan(s.start, s.end, s.regex) for s in t.segments if s.regex is not None],
                       reward=r.reward, group_id=group_id)
            for r in rollouts if (t := r.trajectory.planner) is not None]


async def planner_samples(client: Any, model: str, plan_messages: list[dict[str, str]], plans: list[str],
                          rewards: list[float], group_id: str) -> list[GRPOSample]:
    """GRPO samples of plans scored outside the server (``POST /v1/adapters/{role}/grpo``): the Planner's
    prompt and the plan texts, tokenized here since the caller has text only."""
    role = client.role(model)
    prompt_ids = await role.render_chat(plan_messages)
    return [GRPOSample(prompt_ids=prompt_ids, completion_ids=await role.encode(plan), reward=reward,
                       group_id=group_id)
            for plan, reward in zip(plans, rewards) if plan]
