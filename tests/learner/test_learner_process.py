"""The test-time learner in a process of its own (``learner.process = "spawn"``, the default): its steps run
in a spawned child, results and errors come back with their types, a child killed mid-step is replaced
by a fresh one that publishes the same batch, an idle one that dies is replaced at once, learning turns off
after ``max_restarts`` deaths (serving untouched), and the child dies with its parent.

The engine side is the real ``AdapterRegistry`` over ``RecordingHost`` (test_ttl_durability.py); the
learner, its process and its files are real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mia_engine.learner.batching import GRPOSample
from mia_engine.learner.learner import PlannerLearner
from mia_engine.learner.process import PROCESS_NAME, LearnerProcess
from mia_engine.learner.ttl import TestTimeLearner

from .test_learner import rollouts
from .test_ttl_durability import _assert_learner_matches, _served_weights, _started

DEADLINE_S = 120.0
"""How long a fresh learner process may take to start here (a spawned interpreter imports torch and peft)."""


async def _until(condition, what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _pid(ttl: TestTimeLearner) -> int:
    learner = ttl.planner_learner
    assert isinstance(learner, LearnerProcess)
    return learner.pid


def _is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("process", ["spawn", "thread"])
async def test_the_learner_steps_in_its_own_process_and_publishes(tiny: Path, tmp_path: Path, process: str) -> None:
    ttl, registry, _ = await _started(tiny, tmp_path, process=process)
    try:
        served_before = registry.current("planner")
        if process == "thread":
            assert isinstance(ttl.planner_learner, PlannerLearner)
        else:
            child = psutil.Process(_pid(ttl))
            assert child.pid != os.getpid() and child.ppid() == os.getpid() and child.name() == PROCESS_NAME
            for stop in (signal.SIGINT, signal.SIGTERM):  # what Ctrl-C or a service stop sends the whole group
                os.kill(child.pid, stop)
        report = await ttl.update(rollouts(seed=1))
        assert report.is_published and report.num_learner_restarts == 0, report.reason
        assert registry.current("planner").version == served_before.version + 1
        assert report.step.version == ttl.planner_learner.version == 1
        _assert_learner_matches(ttl, _served_weights(registry))
        bad = GRPOSample(prompt_ids=[1, 2], completion_ids=[10 ** 6], reward=1.0, group_id="q")
        with pytest.raises(ValueError, match="outside the vocabulary") as raised:  # the child's error, its type kept
            await ttl.update(rollouts(seed=2) + [bad])
        if process == "spawn":
            assert "in the learner's process" in raised.value.__notes__[0]
        assert ttl.health.health_entry() is None and ttl.health.num_restarts == 0
    finally:
        ttl.close()
    if process == "spawn":
        assert _is_gone(child.pid)


async def test_a_learner_killed_mid_step_is_replaced_and_the_same_batch_published(tiny: Path, tmp_path: Path) -> None:
    ttl, registry, _ = await _started(tiny, tmp_path, micro_batch_size=1)
    try:
        assert (await ttl.update(rollouts(seed=1))).is_published
        first, served_before = _pid(ttl), registry.current("planner")
        samples = rollouts(seed=2, num_groups=64)  # one forward and backward per sequence: a step of seconds
        update = asyncio.ensure_future(ttl.update(samples))
        await _until(lambda: ttl.planner_learner.pending == "step", "the step to start")
        await asyncio.sleep(0.5)
        assert ttl.planner_learner.pending == "step"
        os.kill(first, signal.SIGKILL)
        report = await asyncio.wait_for(update, DEADLINE_S)
        assert report.is_published and report.num_learner_restarts == 1, report.reason
        assert report.step.num_sequences == len(samples)  # the whole acknowledged batch, on the fresh learner
        assert report.step.version == 2  # numbering kept: v1 was the last published
        assert registry.current("planner").version == served_before.version + 1
        assert _pid(ttl) != first and _is_gone(first)
        _assert_learner_matches(ttl, _served_weights(registry))
        entry = ttl.health.health_entry()
        assert entry is not None and (entry.status, entry.num_restarts) == ("restarted", 1)
        assert "killed by SIGKILL" in entry.last_failure
    finally:
        ttl.close()


async def test_an_idle_learner_that_dies_is_replaced_and_learning_turns_off_after_max_restarts(
        tiny: Path, tmp_path: Path) -> None:
    ttl, registry, _ = await _started(tiny, tmp_path, max_restarts=1)
    try:
        served = registry.current("planner")
        first = _pid(ttl)
        os.kill(first, signal.SIGKILL)
        await _until(lambda: ttl.health.num_restarts == 1 and not ttl._tasks, "the restart")  # with no update
        second = _pid(ttl)
        assert second != first and ttl.is_ready
        os.kill(second, signal.SIGKILL)
        await _until(lambda: ttl.health.is_off, "learning to turn off")
        assert not ttl.is_ready and ttl.planner_learner is None and _is_gone(second)
        entry = ttl.health.health_entry()
        assert entry is not None and (entry.status, entry.num_restarts) == ("off", 1)
        await ttl.submit(rollouts(seed=3))  # a learning request still answers: nothing is kept
        assert not ttl._pending and not ttl._tasks
        assert registry.current("planner") is served  # serving is untouched
    finally:
        ttl.close()


CHILD_OF_A_DOOMED_PARENT = """
import sys
from pathlib import Path
from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.process import LearnerProcess
from tests.learner.test_learner import rollouts

if __name__ == "__main__":
    tiny, samples = Path(sys.argv[1]), rollouts(seed=1) * 1000  # a step of minutes
    learner = LearnerProcess(tiny / "base", tiny / "adapters" / "planner", LearnerConfig(micro_batch_size=1))
    print(learner.pid, flush=True)
    learner.step(samples)  # the child is busy, not reading its pipe
"""


def test_the_learner_process_dies_with_its_parent(tiny: Path, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(CHILD_OF_A_DOOMED_PARENT)
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, str(script), str(tiny)], stdout=subprocess.PIPE, text=True,
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    child = int(parent.stdout.readline())
    try:
        assert psutil.Process(child).ppid() == parent.pid
        time.sleep(2.0)  # its parent printed once the child was up, then sent it the step
        parent.kill()  # no chance to stop its children
        parent.wait()
        deadline = time.monotonic() + 10
        while not _is_gone(child):
            assert time.monotonic() < deadline, "the learner process outlived its parent"
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait()
        if not _is_gone(child):  # a failed case must not leave a learner behind
            psutil.Process(child).kill()


class _Answering:
    """The learner's surface ``_handle`` calls into (the dispatch is pure logic; the real child is above)."""

    version = 3

    def step(self, samples: list) -> int:
        return len(samples)

    def token_logprobs(self, batch: list) -> list:
        return []

    def lora_state(self) -> dict:
        return {}


@pytest.mark.parametrize(("method", "args", "trims"), [
    ("step", ([1, 2],), 1), ("token_logprobs", ([],), 1), ("lora_state", (), 0), ("no_such_call", (), 0)])
def test_the_child_trims_its_heap_after_the_calls_that_end_a_burst(monkeypatch: pytest.MonkeyPatch, method: str,
                                                                   args: tuple, trims: int) -> None:
    """A GRPO step's activations (and a scoring pass's log-prob chunks) are freed when it ends; the child then
    gives glibc's free pages back, after its answer is sent, so its RSS does not ratchet up to its largest
    batch yet."""
    import multiprocessing
    import pickle

    from mia_engine.learner import process as learner_process

    calls: list[str] = []
    monkeypatch.setattr(learner_process, "trim_heap", lambda: calls.append("trim") or (0.0, 0))
    here, child = multiprocessing.Pipe()
    learner_process._handle(child, _Answering(), pickle.dumps((method, args)))  # type: ignore[arg-type]
    is_ok, _, version = pickle.loads(here.recv_bytes())
    assert (is_ok, version) == (method != "no_such_call", 3)
    assert calls == ["trim"] * trims
