"""Keep this process and the engines' scheduler processes off the CPU cores vLLM gave its model workers.

On CPU, vLLM's multiprocess executor pins each model worker's OpenMP threads to a set of cores and
leaves the rest to "the scheduler process" (``vllm/utils/ompmultiprocessing.py``: one core reserved
per worker), but pins nothing else: the engine core, which busy-waits on the worker's queue, and this
serving process (HTTP, the research loop, the sentence encoder, the learner) float over every core,
the worker's included, and the OS puts them there. The model step, which bounds throughput, then
waits for its core. Run once the engines are up when ``cpu.keep_off_model_cores`` is set (off by
default: it helps where the model worker is the bottleneck, and measured slower where more of the work
runs in this process).

Which cores the workers have is read from the processes themselves, not recomputed: a thread of a
child process whose affinity differs from this process's was placed on purpose (vLLM's OpenMP
binding), and every thread that still has this process's affinity, here and in the children, moves
to the cores no such thread holds. Nothing moves when no child pinned anything (GPU engines, ``uni`` executor,
``VLLM_CPU_OMP_THREADS_BIND=nobind``) or when the workers hold every core. Threads started later
inherit the affinity of the thread that starts them, so one pass after the engines start is enough.
Linux only (``/proc``, ``sched_setaffinity``); elsewhere it does nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(PROC / str(pid) / "task")]
    except OSError:  # the process exited meanwhile
        return []


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for tid in _threads(pid):
        try:
            children += [int(c) for c in (PROC / str(pid) / "task" / str(tid) / "children").read_text().split()]
        except OSError:
            continue
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending += _children(current)
    return tree


def _affinity(tid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:  # the thread exited meanwhile
        return None


def plan_moves(affinities: dict[int, frozenset[int]], own: frozenset[int]) -> tuple[frozenset[int], list[int]]:
    """(the cores left to everything else, the threads to move there), from each thread's affinity:
    threads placed otherwise than ``own`` hold their cores (those of ``own``); the threads with ``own``
    move, unless nothing was placed or nothing is left."""
    held = frozenset().union(*(cpus for cpus in affinities.values() if cpus != own)) & own
    rest = own - held
    if not held or not rest:
        return rest, []
    return rest, [tid for tid, cpus in affinities.items() if cpus == own]


def keep_off_model_cores(pid: int | None = None) -> frozenset[int]:
    """Move this process's (``pid``'s) threads and its children's unpinned threads off the cores that
    its children pinned threads to. Returns the cores they now run on (empty: nothing moved)."""
    if not hasattr(os, "sched_setaffinity") or not (PROC / "self" / "task").is_dir():
        return frozenset()
    pid = os.getpid() if pid is None else pid
    own = _affinity(pid)
    if own is None:
        return frozenset()
    affinities = {}
    for process in process_tree(pid):
        for tid in _threads(process):
            cpus = _affinity(tid)
            if cpus is not None:
                affinities[tid] = cpus
    rest, moves = plan_moves(affinities, own)
    if not moves:
        log.info("CPU placement: nothing to move (model workers hold %s of cores %s)",
                 sorted(own - rest) or "none", sorted(own))
        return frozenset()
    moved = 0
    for tid in moves:
        try:
            os.sched_setaffinity(tid, rest)
            moved += 1
        except OSError:  # exited meanwhile
            continue
    log.info("CPU placement: model workers keep cores %s; this process and the engine schedulers "
             "(%d threads) moved to %s", sorted(own - rest), moved, sorted(rest))
    return rest
