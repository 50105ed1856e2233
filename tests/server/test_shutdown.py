"""Ctrl-C in the terminal that runs `serve`: SIGINT to its whole process group (the server, vLLM's
engine core and worker), as a terminal sends it. The server must stop its engines and exit 0, with no
traceback: uvicorn raises the signal again after its own shutdown."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import start_server, stop_server, wait_ready


@pytest.mark.slow
def test_ctrl_c_stops_the_server_cleanly(tmp_path: Path) -> None:
    server = start_server(tmp_path, "tiny", new_session=True)
    try:
        wait_ready(server)
        os.killpg(server.process.pid, signal.SIGINT)
        assert server.process.wait(timeout=60) == 0, server.log_tail()
    finally:
        if server.process.poll() is None:
            stop_server(server)
    log = server.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "stopped (Ctrl-C)" in log and "Application shutdown complete" in log
