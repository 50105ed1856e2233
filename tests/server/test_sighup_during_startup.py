"""A SIGHUP while the server starts is a keys reload, never its end (issue 53).

An operator who edits ``server.keys_file`` and sends SIGHUP while the server (re)starts must not lose it:
from the first moment of ``serve`` the signal is recorded (``key_ring.DeferredSighup``) and the key ring,
once up, reloads for it. The test starts a server with a keys file, adds a key to the file, sends SIGHUP
while the process imports the serving stack (seconds, before any handler of the app exists; Python's
default action used to end the process there), and checks that the server becomes ready and accepts the
new key, and that vLLM's engine core (started by exec) did not inherit SIGHUP ignored. Later in the
start-up the key ring's own handler is installed already. A SIGHUP before the interpreter runs our code
at all cannot be handled by any code.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import psutil
import pytest

from mia_engine.base.key_table import add_key
from tests.conftest import ServerHandle, start_server, wait_ready
from tests.server.test_stop_during_startup import SERVER_EXIT_S, _Descendants, _engine_core, _kill_leftovers, _wait_for


def _importing(tree: _Descendants, server: ServerHandle) -> bool:
    """The server process has loaded torch: it imports the serving stack, before the app (and the key
    ring's handler) exists."""
    try:
        return "libtorch" in Path(f"/proc/{tree.server.pid}/maps").read_text()
    except OSError:
        return False


def _ignores_sighup(process: psutil.Process) -> bool:
    status = Path(f"/proc/{process.pid}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (signal.SIGHUP - 1)))


@pytest.mark.slow
def test_a_sighup_during_startup_reloads_the_keys_once_the_server_is_up(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    add_key(keys_file, "first", ["chat"])
    server = start_server(tmp_path, "tiny", f"--server.keys_file={keys_file}", own_group=True)
    pgid = server.process.pid
    tree = _Descendants(psutil.Process(server.process.pid))
    try:
        _wait_for(_importing, tree, server)
        newcomer = add_key(keys_file, "newcomer", ["chat"])  # as `keys add` does
        os.kill(server.process.pid, signal.SIGHUP)
        wait_ready(server)
        core = _engine_core(tree)
        assert core is not None and not _ignores_sighup(core), "the engine core inherited SIGHUP ignored"
        response = httpx.get(f"{server.openai_url}/models", headers={"Authorization": f"Bearer {newcomer}"}, timeout=30)
        assert response.status_code == 200, response.text
        log = server.log_path.read_text(errors="replace")
        assert "keys: reloaded 2 key(s)" in log, log[-3000:]
        # the ring, built after the signal, reloaded once for it
        assert log.count("keys: a SIGHUP came while the server started; reloading now") == 1, log[-3000:]
        os.killpg(pgid, signal.SIGTERM)
        server.process.wait(timeout=SERVER_EXIT_S)
    finally:
        _kill_leftovers(server, tree, pgid)
