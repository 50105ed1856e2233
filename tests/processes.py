"""Ports and subprocesses for the tests that start a real server. The benchmarks use the same two
(``bench/servers.py``); the tests import nothing from ``bench``."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


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
