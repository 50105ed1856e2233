"""The issue's reproductions over HTTP. 30 acknowledged memory adds, kill -9 of the server's process group,
one byte flipped a third of the way into the journal, restart: every memory but the damaged one is served,
the damaged bytes are kept in a side file, and the log names their offset and size. And a snapshot part
damaged (in both generations kept): the server starts, serves every memory but that part's, and the log
says what was lost."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from mia_engine.config.memory import MemoryConfig
from mia_engine.memory import snapshot as snapshot_module
from mia_engine.memory.entries import MemoryEntry, vector_to_bytes
from mia_engine.memory.framing import CORRUPT_SUFFIX
from mia_engine.memory.journal import JOURNAL_NAME
from mia_engine.memory.store import ExperienceStore

from tests.conftest import (SERVING_ONLY, ServerHandle, launch_tiny, server_fixture, start_server, stop_server,
                            wait_ready_beside_next)
from tests.processes import crash_group

NUM_ADDS = 30


def _add(server, i: int) -> str:
    body = {"question": f"Which river flows through city number {i}?", "workflow_summary": f"1. **search** (-> {i})",
            "label": "correct"}
    response = httpx.post(f"{server.openai_url}/memory/add", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {server.admin_key}"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


journal_server = server_fixture("journal_server", launch_tiny("journal_server", *SERVING_ONLY, own_group=True),
                                scope="function")
"""The server killed mid-run (its own process group: killed whole)."""


@pytest.mark.slow
def test_a_flipped_byte_mid_journal_loses_only_its_record(journal_server: ServerHandle) -> None:
    server = journal_server
    ids = [_add(server, i) for i in range(NUM_ADDS)]
    crash_group(server.process)
    [journal] = list(server.data_dir.rglob(JOURNAL_NAME))
    data = bytearray(journal.read_bytes())
    third = len(data) // 3 + (data[len(data) // 3] == 0xFF)  # not a frame's 0xFF: that loses nothing (framing.py)
    data[third] ^= 0x40
    journal.write_bytes(bytes(data))

    (server.home.parent / "again").mkdir()
    restarted = start_server(server.home.parent / "again", "tiny", *SERVING_ONLY, data_dir=server.data_dir)
    try:
        wait_ready_beside_next(restarted)
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


def _found(server: ServerHandle, entry_id: str) -> bool:
    response = httpx.get(f"{server.openai_url}/memory/{entry_id}", timeout=30,
                         headers={"Authorization": f"Bearer {server.admin_key}"})
    return response.status_code == 200


snapshot_server = server_fixture("snapshot_server", launch_tiny("snapshot_server", *SERVING_ONLY, own_group=True),
                                 scope="function")
"""The server killed mid-run (its own process group: killed whole)."""


@pytest.mark.slow
def test_a_damaged_snapshot_part_loses_only_its_records(snapshot_server: ServerHandle,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    server = snapshot_server
    ids = [_add(server, i) for i in range(12)]
    dim = httpx.get(f"{server.openai_url}/memory/stats", timeout=30,
                    headers={"Authorization": f"Bearer {server.admin_key}"}).json()["dim"]
    crash_group(server.process)
    [journal] = list(server.data_dir.rglob(JOURNAL_NAME))
    ids += _two_generations_in_parts_of_4(journal.parent, dim, monkeypatch)
    previous, newest = [path for _, path in snapshot_module.generations(journal.parent)]  # oldest first
    data = bytearray(newest.read_bytes())
    marks = [i for i, byte in enumerate(data) if byte == 0xFF]
    data[(marks[1] + marks[2]) // 2] ^= 0x01  # part 1: the memories added 5th to 8th
    newest.write_bytes(bytes(data))
    previous.write_bytes(previous.read_bytes()[:-3])  # so the previous generation cannot stand in either

    (server.home.parent / "again").mkdir()
    restarted = start_server(server.home.parent / "again", "tiny", *SERVING_ONLY, data_dir=server.data_dir)
    try:
        wait_ready_beside_next(restarted)
        assert [_found(restarted, entry_id) for entry_id in ids] == [not 4 <= i < 8 for i in range(16)]
        log = restarted.log_path.read_text()
        assert "parts [1] cannot be read: 4 memories" in log and "lost 4 memories and 0 Meta Plan pairs" in log
        assert any(p.name.startswith(newest.name + CORRUPT_SUFFIX) for p in journal.parent.iterdir())
    finally:
        stop_server(restarted)


def _two_generations_in_parts_of_4(memory_dir, dim: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Snapshots of the server's store in parts of 4 records (the server's hold 4096), at its seq and 4 writes
    later (so the journal before the first is retired); returns the ids of those 4 writes."""
    monkeypatch.setattr(snapshot_module, "SNAPSHOT_PART_RECORDS", 4)
    store = ExperienceStore.open(memory_dir, MemoryConfig(), dim)
    store.compact()
    rng = np.random.default_rng(0)
    added = []
    for i in range(4):
        vector = rng.standard_normal(dim).astype(np.float32)
        added.append(store.add(MemoryEntry(f"later{i}", "text", "others", f"later question {i}", "1. **search**",
                                           "correct", question_embedding=vector_to_bytes(vector / np.linalg.norm(vector)))).id)
    store.compact()
    store.close()
    return added
