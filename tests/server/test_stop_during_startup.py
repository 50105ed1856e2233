"""Stopping the server at any moment of its start-up stops vLLM's engine processes too (issue 53).

Ctrl-C, ``systemctl stop`` and a container stop signal the server's whole process group; an OOM kill or
``kill -9`` ends the server alone. Whatever the moment, every process the server started (vLLM's engine
core, its worker, their helpers) must be gone within ``ORPHAN_EXIT_S``: an engine core built while the
server died used to run on under init, ignoring SIGTERM, holding its memory (a GPU's, on a GPU box).
Each case starts its own server and stops it at one moment: right after the server process exists, the
moment the engine core is spawned (its interpreter still importing), once the core runs vLLM's code
(SIGTERM is then only recorded until it is built), while the worker loads the model, and once ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ServerHandle, start_server
from tests.processes import live_members, shared_memory_of, wait_group_exit

ORPHAN_EXIT_S = 15
"""Seconds every process the server started may outlive the server."""
SERVER_EXIT_S = 60
"""Seconds the server may take to exit after the signal (once ready: its engines' orderly shutdown)."""
PHASE_TIMEOUT_S = 300
POLL_S = 0.05
"""Short: the engine core's import, the window before its SIGTERM handler, lasts a few seconds."""
FAST_START = ("--tools.max_passages=8",)
"""A passage index built in a moment (each case's server builds its own, often to be killed mid-way)."""


class _Descendants:
    """Every process the server started, recorded as they appear (and after the server's death, the
    children of those already recorded, which are no longer the server's)."""

    def __init__(self, server: psutil.Process) -> None:
        self.server = server
        self.seen: dict[int, psutil.Process] = {}

    def record(self) -> list[psutil.Process]:
        for parent in [self.server, *self.seen.values()]:
            try:
                children = parent.children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                self.seen.setdefault(child.pid, child)
        return list(self.seen.values())

    def running(self) -> set[str]:
        """Those still running, as "pid name" (the form of ``live_members``)."""
        self.record()
        return {f"{process.pid} {_name(process)}" for process in self.seen.values() if _is_running(process)}


def _is_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return "(gone)"


def _is_spawned(process: psutil.Process) -> bool:
    """A process started by multiprocessing's spawn (vLLM's engine core and workers; not the resource
    tracker), before or after vLLM named it."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return "spawn_main" in command or command.startswith("VLLM::")


def _engine_core(tree: _Descendants) -> psutil.Process | None:
    """The server's spawned child (None before it exists)."""
    return next((p for p in tree.record() if _is_spawned(p) and _parent(p) == tree.server.pid), None)


def _parent(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.Error:
        return None


def _core_spawned(tree: _Descendants, server: ServerHandle) -> bool:
    return _engine_core(tree) is not None


def _core_running(tree: _Descendants, server: ServerHandle) -> bool:
    """vLLM named the process: its SIGTERM handler (which only records the signal) is installed."""
    core = _engine_core(tree)
    try:
        return core is not None and core.name().startswith("VLLM::EngineCore")
    except psutil.Error:
        return False


def _worker_spawned(tree: _Descendants, server: ServerHandle) -> bool:
    core = _engine_core(tree)
    try:
        return core is not None and any(_is_spawned(child) for child in core.children())
    except psutil.Error:
        return False


def _ready(tree: _Descendants, server: ServerHandle) -> bool:
    try:
        return httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _started(tree: _Descendants, server: ServerHandle) -> bool:
    return True


Phase = Callable[[_Descendants, ServerHandle], bool]


def _wait_for(phase: Phase, tree: _Descendants, server: ServerHandle) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not phase(tree, server):
        assert server.process.poll() is None, f"server exited with {server.process.returncode}:\n{server.log_tail()}"
        assert time.monotonic() < deadline, f"{phase.__name__} not reached:\n{server.log_tail()}"
        time.sleep(POLL_S)


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "whole_group"), [
    (_started, True),
    (_core_spawned, True),
    (_core_running, True),
    (_worker_spawned, False),
    (_ready, True),
], ids=["sigterm-group-at-start", "sigterm-group-core-spawned", "sigterm-group-core-running",
        "sigkill-server-worker-spawned", "sigterm-group-ready"])
def test_engine_processes_die_with_the_server(tmp_path: Path, phase: Phase, whole_group: bool) -> None:
    """``whole_group``: SIGTERM to the server's process group (Ctrl-C, systemctl, a container stop);
    otherwise SIGKILL to the server alone, which can stop nothing: its children must notice."""
    server = start_server(tmp_path, "tiny", *FAST_START, f"--tools.index_dir={tmp_path / 'index'}", own_group=True)
    pgid = server.process.pid
    tree = _Descendants(psutil.Process(server.process.pid))
    try:
        _wait_for(phase, tree, server)
        tree.record()
        if whole_group:
            os.killpg(pgid, signal.SIGTERM)
        else:
            server.process.kill()
        server.process.wait(timeout=SERVER_EXIT_S)
        deadline = time.monotonic() + ORPHAN_EXIT_S
        while (running := tree.running() | set(live_members(pgid))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running, f"still running {ORPHAN_EXIT_S} s after the server exited: {running}\n{server.log_tail()}"
    finally:
        _kill_leftovers(server, tree, pgid)


def _kill_leftovers(server: ServerHandle, tree: _Descendants, pgid: int) -> None:
    """Whatever a failed case left: this machine must not keep an orphaned engine holding its memory, nor
    the shared memory its processes had mapped (the resource tracker that would remove it dies too)."""
    files = shared_memory_of(pgid)
    if server.process.poll() is None:
        server.process.kill()
    for process in tree.record():
        try:
            process.kill()
        except psutil.Error:
            continue
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    wait_group_exit(pgid, timeout_s=10)
    for file in files:
        file.unlink(missing_ok=True)
