"""Ports and subprocesses for the tests that start a real server. The benchmarks use the same two
(``bench/servers.py``); the tests import nothing from ``bench``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

GROUP_EXIT_S = 30
"""Seconds the rest of a server's process group (vLLM's processes, the resource tracker) may take to exit
after the server has."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM (the server shuts its engines down), then SIGKILL if it has not exited in time."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def refused_serve(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """Run ``serve --config tiny`` with ``overrides`` that its preflight must refuse (nothing starts, so it
    returns at once); the caller checks the exit code and the last stderr line."""
    cmd = [sys.executable, "-m", "mia_engine", "serve", "--config", "tiny", *overrides,
           "--data-dir", str(tmp_path / "data"), "--port", "0"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={"MIA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})


def _members(pgid: int) -> list[psutil.Process]:
    """The processes of group ``pgid`` still running (zombies awaiting their reaper excluded)."""
    members = []
    for process in psutil.process_iter(["name", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def live_members(pgid: int) -> list[str]:
    """The processes of group ``pgid`` still running, as "pid name"."""
    return [f"{process.pid} {process.info['name']}" for process in _members(pgid)]


def wait_group_exit(pgid: int, timeout_s: float = GROUP_EXIT_S) -> list[str]:
    """Wait until no process of group ``pgid`` runs (a server started with its own session, after the
    server itself exited); return those still running at ``timeout_s``. Everything the group writes to
    the server's log is there once it returns empty."""
    deadline = time.monotonic() + timeout_s
    while (members := live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members


def shared_memory_of(pgid: int) -> set[Path]:
    """The ``/dev/shm`` files of the running processes of group ``pgid``: those mapped (vLLM's queues
    between its engine core and workers) and joblib's semaphores, named after the pid that made them."""
    files = set()
    for process in _members(pgid):
        files.update(Path("/dev/shm").glob(f"sem.loky-{process.pid}-*"))
        try:
            files.update(Path(m.path) for m in process.memory_maps() if m.path.startswith("/dev/shm/"))
        except psutil.Error:
            continue
    return files


def crash_group(process: subprocess.Popen) -> None:
    """SIGKILL the whole process group ``process`` leads (a server started with ``own_group``), as a
    power cut would, then remove the shared memory its processes had mapped: the resource tracker that
    would have removed it dies with them, and the test machine's ``/dev/shm`` would keep it."""
    files = shared_memory_of(process.pid)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert not wait_group_exit(process.pid)
    for file in files:
        file.unlink(missing_ok=True)
