"""Moving this process and the engines' schedulers off the cores vLLM pinned its model workers to."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mia_engine.engines.cpu.placement import plan_moves

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


SCENARIO = """
import json, os, subprocess, sys
from mia_engine.engines.cpu.placement import keep_off_model_cores, process_tree
own = frozenset(os.sched_getaffinity(0))
core = min(own)
pinned = subprocess.Popen([sys.executable, "-c", f"import os, time; os.sched_setaffinity(0, {{{core}}}); "
                           "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
unpinned = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
try:
    assert pinned.stdout.readline().strip() == "ready"
    tree = process_tree(os.getpid())
    rest = keep_off_model_cores()
    print(json.dumps({"own": sorted(own), "core": core, "in_tree": pinned.pid in tree and unpinned.pid in tree,
                      "rest": sorted(rest), "this": sorted(os.sched_getaffinity(0)),
                      "unpinned": sorted(os.sched_getaffinity(unpinned.pid)),
                      "pinned": sorted(os.sched_getaffinity(pinned.pid))}))
finally:
    for child in (pinned, unpinned):
        child.kill()
        child.wait()
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least two cores")
def test_a_child_pinned_to_a_core_keeps_it_and_everything_else_leaves_it() -> None:
    """Real processes, in a fresh process (so nothing this test session pinned counts): a child pins
    itself to one core (as vLLM's worker does), another child does not (as the engine core);
    afterwards that process and the unpinned child run on the other cores only."""
    done = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    rest = sorted(set(seen["own"]) - {seen["core"]})
    assert seen["in_tree"] and seen["rest"] == rest
    assert seen["this"] == rest and seen["unpinned"] == rest and seen["pinned"] == [seen["core"]]
