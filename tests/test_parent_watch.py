"""The parent watch (``base/parent_watch.py``) without vLLM: a tree of spawned processes (root → middle →
leaf, as server → engine core → worker; the leaf daemonic, as vLLM starts its workers) whose root is
SIGKILLed: once the tree is up, while the middle one is still "importing" (before its watch begins), and
when the middle one exits by itself after its parent's death. The processes are real; the root is a
subprocess of the test in a process group of its own, so that whatever a failure leaves is killed."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mia_engine.base.parent_watch import PARENT_PID_ENV, mark_root, watch_parent

POLL_S = 0.05
EXIT_S = 10
"""Seconds the root's descendants may outlive it (the watch sees it within ``POLL_S``; the leaf's spawn
and the interpreters' start take the rest on a busy machine)."""
REPO = Path(__file__).resolve().parent.parent


def _root(delay_s: str, middle: str = "_middle") -> None:
    """The server's part: names itself the root, spawns the middle process, waits to be killed."""
    mark_root()
    target = globals()[middle]
    multiprocessing.get_context("spawn").Process(target=target, args=(float(delay_s),), name="Middle").start()
    time.sleep(600)


def _middle(delay_s: float) -> None:
    """The engine core's: ``delay_s`` stands for the imports before vLLM calls the platform plugin."""
    time.sleep(delay_s)
    watch_parent(poll_s=POLL_S)
    multiprocessing.get_context("spawn").Process(target=_leaf, name="Leaf", daemon=True).start()
    time.sleep(600)


def _middle_that_exits(delay_s: float) -> None:
    """An engine core whose start fails once its parent is gone: it exits by itself, and its interpreter's
    teardown (an exit handler that sleeps, run after the watch's own) would keep it alive; the watch
    thread polls too seldom to matter."""
    atexit.register(time.sleep, 600)
    watch_parent(poll_s=600)
    multiprocessing.get_context("spawn").Process(target=_leaf, name="Leaf", daemon=True).start()
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(POLL_S)
    sys.exit(1)


def _leaf() -> None:
    watch_parent(poll_s=POLL_S)
    time.sleep(600)


def _start_root(delay_s: float, middle: str) -> subprocess.Popen:
    code = f"from tests.test_parent_watch import _root; _root({str(delay_s)!r}, {middle!r})"
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, process_group=0)


def _descendants_once(root: psutil.Process, seen: dict[int, psutil.Process], depth: int) -> bool:
    """Record ``root``'s descendants in ``seen``; whether one ``depth`` levels down exists yet."""
    try:
        children = root.children(recursive=True)
    except psutil.Error:
        return False
    for child in children:
        seen.setdefault(child.pid, child)
    return any(_depth(child, root.pid) == depth for child in children)


def _depth(process: psutil.Process, root_pid: int) -> int:
    try:
        ancestors = [parent.pid for parent in process.parents()]
    except psutil.Error:
        return -1
    return ancestors.index(root_pid) + 1 if root_pid in ancestors else -1


def _running(seen: dict[int, psutil.Process]) -> list[int]:
    running = []
    for process in seen.values():
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process.pid)
        except psutil.Error:
            continue
    return running


def _kill_tree_then_check(delay_s: float, depth: int, middle: str = "_middle") -> None:
    """Start the tree, SIGKILL the root once a process ``depth`` levels down exists, and check that every
    descendant seen is gone within ``EXIT_S``."""
    root = _start_root(delay_s, middle)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 60
        while not _descendants_once(psutil.Process(root.pid), seen, depth):
            assert root.poll() is None and time.monotonic() < deadline, "the tree never came up"
            time.sleep(0.02)
        root.kill()
        root.wait(timeout=10)
        deadline = time.monotonic() + EXIT_S
        while (running := _running(seen)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running, f"outlived their root by {EXIT_S} s: {running}"
    finally:
        for process in [*seen.values()]:
            try:
                process.kill()
            except psutil.Error:
                continue
        try:
            os.killpg(root.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        root.wait(timeout=10)


def test_the_tree_dies_with_its_root() -> None:
    """The root dies once the leaf runs: the middle sees its parent change and kills itself and the leaf."""
    _kill_tree_then_check(delay_s=0, depth=2)


def test_a_child_whose_root_died_before_its_watch_began_exits() -> None:
    """The root dies while the middle still "imports": its watch finds another parent and exits at once,
    before it starts the leaf."""
    _kill_tree_then_check(delay_s=1.5, depth=1)


def test_an_orphan_exiting_by_itself_skips_its_teardown() -> None:
    _kill_tree_then_check(delay_s=0, depth=2, middle="_middle_that_exits")


def test_a_main_process_is_never_watched() -> None:
    """In a program's main process (this test's), an inherited variable naming another process, alive or
    dead, changes nothing: no exit, no watch, the variable left as it was."""
    for pid in (os.getppid(), 2**22 + 1):
        environ = {PARENT_PID_ENV: str(pid)}
        watch_parent(environ)
        assert environ == {PARENT_PID_ENV: str(pid)}


def test_mark_root_names_this_process() -> None:
    environ: dict[str, str] = {}
    mark_root(environ)
    assert environ == {PARENT_PID_ENV: str(os.getpid())}
