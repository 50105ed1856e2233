"""Fail fast, as ``vllm serve`` does: an engine that dies while serving, or cannot start, ends the server
process with exit status 1 and the cause as the last line on stderr, so an orchestrator restarts it,
instead of the server answering 503 for good."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ServerHandle, launch_tiny, server_fixture, start_server
from tests.processes import crash_group

EXIT_WITHIN_S = 10.0
ENGINE_CORE_TITLE = "VLLM::EngineCore"
"""The process title vLLM gives its engine-core process."""


def _engine_core(server: ServerHandle) -> psutil.Process:
    children = psutil.Process(server.process.pid).children(recursive=True)
    cores = [child for child in children if ENGINE_CORE_TITLE in " ".join(child.cmdline()) or child.name() == ENGINE_CORE_TITLE]
    assert len(cores) == 1, [(child.pid, child.cmdline()) for child in children]
    return cores[0]


def _error_lines(server: ServerHandle) -> list[str]:
    """The server's closing error lines (after it, vLLM's resource tracker may still warn about the
    shared memory a killed engine core left behind, which it then removes)."""
    return [line for line in server.log_path.read_text(errors="replace").splitlines()
            if line.startswith("python -m mia_engine: error:")]


quiet_server = server_fixture(
    "quiet_server", launch_tiny("quiet_server", "--server.log_level=warning", own_group=True), scope="function")
"""The server whose engine core is killed (its own process group: what is left of it is killed whole)."""


@pytest.mark.slow
def test_a_killed_engine_core_ends_the_server(quiet_server: ServerHandle) -> None:
    """kill -9 of vLLM's engine core: the server exits 1 within seconds, naming the engine; at log level
    warning neither this process nor vLLM's (its own and its engine's) logs an INFO line."""
    server = quiet_server
    try:
        _engine_core(server).kill()
        killed = time.monotonic()
        code = server.process.wait(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if server.process.poll() is None:
            crash_group(server.process)
    log = server.log_path.read_text(errors="replace")
    assert code == 1 and elapsed < EXIT_WITHIN_S, (code, elapsed, log[-3000:])
    lines = _error_lines(server)
    assert len(lines) == 1 and lines[0].startswith("python -m mia_engine: error: engine tiny died"), log[-3000:]
    assert " INFO " not in log, [line for line in log.splitlines() if " INFO " in line][:5]


def test_an_engine_that_cannot_start_ends_the_server(tmp_path: Path) -> None:
    """A model folder that passes the preflight (it has a config.json) but that vLLM cannot load: exit 1,
    the last line naming the engine's start failure. (A folder that does not exist is refused earlier, by
    the preflight, with exit 2: ``tests/engines/test_engine_args.py``.)"""
    broken = tmp_path / "nonexistent_arch_model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "nonexistent_arch", "architectures": ["NoSuchForCausalLM"]}')
    server = start_server(tmp_path, "tiny", f"--engines.tiny.model={broken}")
    try:
        code = server.process.wait(timeout=120)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    lines = _error_lines(server)
    assert code == 1, server.log_tail()
    assert len(lines) == 1 and lines[0].startswith("python -m mia_engine: error: engine start failed"), lines
    assert "tokenizer" in lines[0] and lines[0].endswith("to a fast one."), lines  # vLLM's multi-line error, on one line
