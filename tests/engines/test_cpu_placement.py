"""Moving this process and the engines' schedulers off the cores vLLM pinned its model workers to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mia_engine.engines.cpu_placement import keep_off_model_cores, plan_moves, process_tree

ALL = frozenset({0, 1, 2, 3})


def test_pinned_threads_keep_their_cores_and_the_others_move_to_the_rest() -> None:
    affinities = {10: ALL, 11: ALL, 20: frozenset({0}), 21: frozenset({1}), 22: ALL}
    rest, moves = plan_moves(affinities, ALL)
    assert rest == {2, 3} and sorted(moves) == [10, 11, 22]


def test_a_worker_placed_partly_outside_this_process_still_holds_its_cores_here() -> None:
    """This process was started on cores 0-3 (taskset); vLLM bound a worker to 3-5: 3 is held, and the
    worker's thread, not on this process's set, is not moved."""
    rest, moves = plan_moves({10: ALL, 20: frozenset({3, 4, 5})}, ALL)
    assert rest == {0, 1, 2} and moves == [10]


@pytest.mark.parametrize("affinities", [{10: ALL, 11: ALL},  # nothing pinned (GPU engines, uni, nobind)
                                        {10: ALL, 20: frozenset({0, 1}), 21: frozenset({2, 3})}])  # every core held
def test_nothing_moves_when_nothing_is_pinned_or_nothing_is_left(affinities: dict) -> None:
    assert plan_moves(affinities, ALL)[1] == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least two cores")
def test_a_child_pinned_to_a_core_keeps_it_and_everything_else_leaves_it() -> None:
    """Real processes: a child pins itself to one core (as vLLM's worker does), another child does not
    (as the engine core); afterwards this process and the unpinned child run on the other cores only."""
    own = frozenset(os.sched_getaffinity(0))
    core = min(own)
    pinned = subprocess.Popen([sys.executable, "-c", f"import os, time; os.sched_setaffinity(0, {{{core}}}); "
                               "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    unpinned = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pinned.stdout is not None and pinned.stdout.readline().strip() == "ready"
        assert {pinned.pid, unpinned.pid} <= set(process_tree(os.getpid()))
        rest = keep_off_model_cores()
        assert rest == own - {core}
        assert os.sched_getaffinity(0) == rest and os.sched_getaffinity(unpinned.pid) == rest
        assert os.sched_getaffinity(pinned.pid) == {core}
    finally:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), own)
            except OSError:
                pass
        for child in (pinned, unpinned):
            child.kill()
            child.wait()
    assert os.sched_getaffinity(0) == own
