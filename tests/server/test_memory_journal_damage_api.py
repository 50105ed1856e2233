"""The issue's reproduction over HTTP: 30 acknowledged memory adds, kill -9 of the server's process group,
one byte flipped a third of the way into the journal, restart: every memory but the damaged one is served,
the damaged bytes are kept in a side file, and the log names their offset and size."""

from __future__ import annotations

import httpx
import pytest

from mia_engine.memory.journal import CORRUPT_SUFFIX, JOURNAL_NAME

from tests.conftest import ServerHandle, launch_tiny, server_fixture, start_server, stop_server, wait_ready
from tests.processes import crash_group

NUM_ADDS = 30


def _add(server, i: int) -> str:
    body = {"question": f"Which river flows through city number {i}?", "workflow_summary": f"1. **search** (-> {i})",
            "label": "correct"}
    response = httpx.post(f"{server.openai_url}/memory/add", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {server.admin_key}"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


journal_server = server_fixture("journal_server", launch_tiny("journal_server", own_group=True), scope="function")
"""The server killed mid-run (its own process group: killed whole)."""


@pytest.mark.slow
def test_a_flipped_byte_mid_journal_loses_only_its_record(journal_server: ServerHandle) -> None:
    server = journal_server
    ids = [_add(server, i) for i in range(NUM_ADDS)]
    crash_group(server.process)
    [journal] = list(server.data_dir.rglob(JOURNAL_NAME))
    data = bytearray(journal.read_bytes())
    data[len(data) // 3] ^= 0x40
    journal.write_bytes(bytes(data))

    (server.home.parent / "again").mkdir()
    restarted = start_server(server.home.parent / "again", "tiny", data_dir=server.data_dir)
    try:
        wait_ready(restarted)
        found = [httpx.get(f"{restarted.openai_url}/memory/{entry_id}", timeout=30,
                           headers={"Authorization": f"Bearer {restarted.admin_key}"}).status_code == 200
                 for entry_id in ids]
        assert found.count(False) == 1, found  # the damaged record only
        assert NUM_ADDS // 5 < found.index(False) < NUM_ADDS - 1
        [side] = [p for p in journal.parent.iterdir() if p.name.startswith(JOURNAL_NAME + CORRUPT_SUFFIX)]
        assert side.stat().st_size > 0 and side.name in restarted.log_path.read_text()
        assert "damaged run of" in restarted.log_path.read_text()
    finally:
        stop_server(restarted)
