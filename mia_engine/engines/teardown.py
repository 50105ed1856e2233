"""Letting vLLM's engine-core processes finish a teardown they have already begun.

A Ctrl-C in a terminal reaches every process of the foreground group at once: the engine core starts its
own teardown (stop its workers, then free the shared-memory queue it created for them) while this process
stops its engines through vLLM, which sends each engine core a SIGTERM. vLLM's engine core restores the
default SIGTERM action as its busy loop ends, so that SIGTERM kills it mid-teardown: its queue is never
unlinked and the resource tracker reports it as leaked. Waiting for an engine core that is already tearing
down, and signalling only one that is not, keeps both paths clean. The one signalled gets as long to tear
down before vLLM kills it (``teardown_timeout_s``): vLLM's default grace is the workers' alone.
"""

from __future__ import annotations

import signal
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from vllm import envs

PROC = Path("/proc")

TEARDOWN_MARGIN_S = 10.0
"""Seconds an engine core's teardown may take beyond the wait for its workers (vLLM's
``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``): up to 4 s to SIGTERM, then SIGKILL, workers that outstay that
wait, then freeing its distributed state and exiting."""


def teardown_timeout_s() -> float:
    """Seconds an engine core may take to tear down once asked: vLLM's worker shutdown timeout plus
    ``TEARDOWN_MARGIN_S``."""
    return envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS + TEARDOWN_MARGIN_S


def catches_sigterm(pid: int) -> bool | None:
    """Whether process ``pid`` has a SIGTERM handler installed (its ``SigCgt`` mask in ``/proc``); None
    when that cannot be read (the process is gone)."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return None


def await_begun_teardowns(llm: Any, timeout_s: float | None = None) -> list[int]:
    """Wait (up to ``timeout_s`` in all; default ``teardown_timeout_s()``) for each live engine core of
    ``llm`` (an ``AsyncLLM``) that no longer catches SIGTERM, i.e. is already tearing down; return the
    pids waited for. An engine core still catching SIGTERM is left to vLLM's shutdown, whose SIGTERM its
    handler turns into an orderly stop; one that ``llm`` does not run itself (e.g. under Ray) is not
    looked at."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    processes: list[BaseProcess] = list(getattr(getattr(resources, "engine_manager", None), "processes", None)
                                        or [])
    begun = [process for process in processes if process.pid is not None and process.is_alive()
             and catches_sigterm(process.pid) is False]
    if not begun:
        return []
    # what vLLM's own shutdown marks first; its engine monitor then takes these exits as expected, where it
    # would otherwise log each as an engine core that "exited unexpectedly"
    resources.engine_dead = True
    deadline = time.monotonic() + (teardown_timeout_s() if timeout_s is None else timeout_s)
    for process in begun:
        process.join(max(0.0, deadline - time.monotonic()))
    return [process.pid for process in begun]
