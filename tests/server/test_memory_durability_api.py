"""The issue's reproduction over HTTP: an oversized memory write followed by a small one, then kill -9 of
the server's whole process group. The oversized write must be refused (413), the small one must survive."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import (SERVING_ONLY, ServerHandle, launch_tiny, server_fixture, start_server, stop_server,
                            wait_ready_beside_next)
from tests.processes import crash_group

MAX_RECORD_BYTES = 64 * 1024
ADD = {"question": "Which river flows through Vienna?", "workflow_summary": "1. **search** (-> Danube)",
       "label": "correct"}


def _add(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.openai_url}/memory/add", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {server.admin_key}"})


ARGS = (f"--memory.durability.max_record_bytes={MAX_RECORD_BYTES}",)
durable_server = server_fixture("durable_server", launch_tiny("durable_server", *ARGS, *SERVING_ONLY, own_group=True),
                                scope="function")
"""The server killed mid-run (its own process group: killed whole)."""


@pytest.mark.slow
def test_a_write_replay_would_refuse_is_413_and_nothing_acknowledged_is_lost(durable_server: ServerHandle) -> None:
    server = durable_server
    huge = _add(server, {**ADD, "trajectory": "x" * (2 * MAX_RECORD_BYTES)})  # under the body cap
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "record_too_large", huge.text
    small = _add(server, ADD)
    assert small.status_code == 200
    crash_group(server.process)
    restarted = start_server(server.home.parent, "tiny", *ARGS, *SERVING_ONLY, data_dir=server.data_dir)
    try:
        wait_ready_beside_next(restarted)
        got = httpx.get(f"{restarted.openai_url}/memory/{small.json()['id']}",
                        headers={"Authorization": f"Bearer {restarted.admin_key}"})  # the admin scope reads questions
        assert got.status_code == 200 and got.json()["question"] == ADD["question"]
        assert "corrupt tail" not in restarted.log_path.read_text()
    finally:
        stop_server(restarted)
