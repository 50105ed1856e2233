"""Engine processes die with the process that started them, whatever the moment.

vLLM spawns its engine core from the serving process, and the core spawns its workers. When the server
dies during start-up (SIGTERM to its group while the core is being built, which vLLM's core only records
until construction ends; SIGKILL; a container stop), nothing tells the core: it goes on loading the
model and then waits minutes in its handshake with the dead front end, holding its memory (a GPU's, on
a GPU box). vLLM's one parent-death channel, a worker's death pipe, is watched only once the worker has
loaded its model, and it asks for a graceful stop.

``watch_parent`` runs in every process vLLM starts, as early as this package gets control there (the
platform plugin, which vLLM resolves while the spawned child imports its entry point, before any model,
device or handshake). It checks that its parent is still the process that started it, then a daemon
thread polls for the parent to change; when it does, the process SIGKILLs its descendants and itself.
A poll, not Linux's parent-death signal: that one fires when the *thread* that spawned the child exits,
and the engines are built on executor threads. A process that exits by itself (an engine core whose
start failed: the signal reached a command it ran) looks once more at interpreter exit, since its
teardown's garbage collection can take seconds while daemon threads no longer run.

The starter's pid comes by environment (``PARENT_PID_ENV``): the serving process names itself
(``mark_root``), and each watched process names itself in turn before it starts children of its own. A
process whose parent died before its watch began no longer has that parent and exits at once. Without
the variable (vLLM used outside ``serve``) nothing is watched.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import MutableMapping
from typing import NoReturn

import psutil

PARENT_PID_ENV = "MIA_ENGINE_PARENT_PID"
"""The pid of the process that started this one (set by ``mark_root`` and ``watch_parent``)."""

POLL_S = 0.5
"""Seconds between two looks at the parent: how long an orphan may live (a ``getppid`` call each)."""


def mark_root(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make this process the one its engine processes die with; call before any engine starts."""
    environ[PARENT_PID_ENV] = str(os.getpid())


def watch_parent(environ: MutableMapping[str, str] = os.environ, poll_s: float = POLL_S) -> None:
    """In a process multiprocessing started under ``mark_root``: exit now if the process that started it
    has died, else die with its parent from now on. Does nothing in a program's main process (a variable
    inherited by accident never stops a server), outside a root, or when called again."""
    starter = int(environ.get(PARENT_PID_ENV) or 0)
    if not starter or starter == os.getpid() or not _is_multiprocessing_child():
        return
    parent = os.getppid()
    if parent != starter and not _is_ancestor(starter):
        _die(f"the process that started it ({starter}) exited before its start")
    environ[PARENT_PID_ENV] = str(os.getpid())
    threading.Thread(target=_watch, args=(parent, poll_s), name="mia-parent-watch", daemon=True).start()
    atexit.register(_exit_now_if_orphaned, parent)


def _is_multiprocessing_child() -> bool:
    """Whether multiprocessing started this process. A spawned child is named (``Process.name``, vLLM's
    "EngineCore", "VllmWorker-0") before it unpickles its target, when this package's plugin first runs;
    ``parent_process`` is set only afterwards."""
    return multiprocessing.parent_process() is not None or multiprocessing.current_process().name != "MainProcess"


def _is_ancestor(pid: int) -> bool:
    """Whether ``pid`` is among this process's ancestors (a process started through one of ours that runs
    no watch, a shell for instance, has it as grandparent)."""
    return any(ancestor.pid == pid for ancestor in psutil.Process().parents())


def _watch(parent: int, poll_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    _die(f"its parent ({parent}) exited")


def _exit_now_if_orphaned(parent: int) -> None:
    """At interpreter exit (an engine core that failed its start): the interpreter's teardown can take
    seconds of garbage collection, during which the daemon watch thread no longer runs; an orphan skips it."""
    if os.getppid() != parent:
        for stream in (sys.stdout, sys.stderr):  # this thread holds no lock of theirs
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                continue
        _die(f"its parent ({parent}) exited before it")


def _die(reason: str) -> NoReturn:
    """SIGKILL this process's descendants, then itself: an orphan must not wait for a graceful stop that
    needs its dead parent. The line goes straight to fd 2: a logging lock the main thread holds must not
    keep it alive."""
    me = psutil.Process()
    descendants = me.children(recursive=True)
    try:
        os.write(2, f"mia_engine: process {me.pid} stops: {reason}; killing it and {len(descendants)} "
                    "descendant(s)\n".encode())
    except OSError:
        pass
    for process in descendants:
        try:
            process.kill()
        except psutil.Error:
            continue
    os.kill(me.pid, signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL sent to self")
