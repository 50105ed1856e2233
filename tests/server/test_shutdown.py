"""Ctrl-C in the terminal that runs `serve`: SIGINT to its whole process group (the server, vLLM's
engine core and worker), as a terminal sends it. The server must stop its engines and exit 0, with no
traceback (uvicorn raises the signal again after its own shutdown), and nothing printed after its
last line. The engine core gets the signal too and begins its own teardown; the server waits for it
rather than kill it halfway (which leaves the shared memory it made for its workers for the resource
tracker to report)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator

import pytest

from tests.conftest import ServerHandle, start_server, stop_server, wait_ready
from tests.processes import wait_group_exit


def _start(factory: pytest.TempPathFactory, sigint_ignored: bool) -> ServerHandle:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint_ignored else None
    try:
        return start_server(factory.mktemp("ctrl_c"), "tiny", own_group=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, ServerHandle]]:
    """Each case's own server, by ``sigint_ignored``; both start at once (one core each), not one per test."""
    launched = {}
    try:
        for sigint_ignored in (False, True):
            launched[sigint_ignored] = _start(tmp_path_factory, sigint_ignored)
        for server in launched.values():
            wait_ready(server)
        yield launched
    finally:
        for server in launched.values():
            if server.process.poll() is None:
                stop_server(server)


@pytest.mark.slow
@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_ctrl_c_stops_the_server_cleanly(servers: dict[bool, ServerHandle], sigint_ignored: bool) -> None:
    """``sigint_ignored``: the server inherits SIGINT ignored, as a background job of a non-interactive
    shell does; uvicorn still stops on it, and its re-raised signal is then ignored."""
    server = servers[sigint_ignored]
    try:
        os.killpg(server.process.pid, signal.SIGINT)
        assert server.process.wait(timeout=60) == 0, server.log_tail()
        assert not wait_group_exit(server.process.pid), server.log_tail()  # the log is complete from here
    finally:
        if server.process.poll() is None:
            stop_server(server)
    log = server.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("stopped (Ctrl-C)") == 1 and "Application shutdown complete" in log
    assert "exited unexpectedly" not in log, log[-3000:]  # vLLM's engine monitor took the exit as expected
    # nothing from this process's interpreter teardown after its last line (objects still frozen out of
    # the garbage collector's reach then outlive it, and triton's bindings print a report of "leaked"
    # ones), nor from its resource tracker (shared memory an engine core killed mid-teardown never
    # unlinked); vLLM's processes may still log their own exit, each line with its "(Name pid=N)" prefix
    after = log[log.index("stopped (Ctrl-C)"):].splitlines()[1:]
    assert all(re.match(r"\(\w+ pid=\d+\) ", line) for line in after if line.strip()), "\n".join(after)[:2000]
