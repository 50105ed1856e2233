"""Crash safety of the store: kill -9, torn and corrupt journal tails, snapshot + replay."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mia_engine.base.files import UnsafeFolder
from mia_engine.config.memory import DurabilityConfig, MemoryConfig
from mia_engine.memory.entries import MemoryEntry, MetaPlanPair, RecordTooLarge, vector_to_bytes
from mia_engine.memory.journal import JOURNAL_NAME, SNAPSHOT_NAME, StoreInUse
from mia_engine.memory.snapshot import generations
from mia_engine.memory.store import ExperienceStore

from .factories import FakeClock, make_entry, memory_config, open_store, state_of, unit

REPO_ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("_writer.py")
JOURNAL_LOGGER = "mia_engine.memory.recovery"
WRITER_DIM = 16  # _writer.DIM


def _fill(path: Path, num_entries: int, config: MemoryConfig | None = None) -> list[str]:
    """A store with ``num_entries`` journaled adds (no snapshot), closed as a crash would leave it."""
    rng = np.random.default_rng(0)
    store = open_store(path, config)
    ids = [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(num_entries)]
    store.close()
    return ids


def _journal_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == JOURNAL_LOGGER and r.levelno >= logging.WARNING]


def test_garbage_tail_is_cut_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ids = _fill(tmp_path, 5)
    with open(tmp_path / JOURNAL_NAME, "ab") as journal:
        journal.write(os.urandom(37))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        store = open_store(tmp_path)
    assert len(_journal_warnings(caplog)) == 1
    assert "torn or corrupt tail of 37 bytes" in _journal_warnings(caplog)[0].getMessage()
    assert all(entry_id in store for entry_id in ids)
    store.close()

    caplog.clear()  # the tail was truncated: the next open is clean
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        open_store(tmp_path).close()
    assert _journal_warnings(caplog) == []


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_damaged_last_record_is_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    ids = _fill(tmp_path, 6)
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    if damage == "cut":
        del data[-10:]
    else:
        data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        store = open_store(tmp_path)
    assert len(_journal_warnings(caplog)) == 1
    assert [entry_id in store for entry_id in ids] == [True] * 5 + [False]
    new_id = store.add(make_entry(unit(np.random.default_rng(9)))).id  # appends after the repair
    store.close()
    reopened = open_store(tmp_path)
    assert new_id in reopened and all(entry_id in reopened for entry_id in ids[:5])
    reopened.close()


def test_snapshot_plus_replay_restores_exact_state(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    config = memory_config(snapshot_interval=4)
    store = open_store(tmp_path, config)
    ids = []
    for i in range(11):  # each write, then the background snapshot it may have started: a fixed schedule
        ids.append(store.add(make_entry(unit(rng), label="incorrect" if i % 3 else "correct")).id)
        store.wait_for_snapshot()
    store.record_outcome(ids[:5], True)
    store.record_outcome(ids[3:7], False)
    store.delete(ids[8])
    store.add_meta_plan(_pair(unit(rng)))
    store.wait_for_snapshot()
    before = state_of(store)
    assert 0 < store.stats().num_records_since_snapshot < 4  # some state lives only in the journal
    store.close()
    assert [seq for seq, _ in generations(tmp_path)] == [8, 12]  # the newest two
    reopened = open_store(tmp_path, config)
    assert state_of(reopened) == before
    reopened.close()


def test_crash_between_snapshot_and_journal_truncation_replays_nothing_twice(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    store = open_store(tmp_path)
    entry_id = store.add(make_entry(unit(rng))).id
    store.record_outcome([entry_id], True)
    stale_journal = (tmp_path / JOURNAL_NAME).read_bytes()
    store.compact()
    before = state_of(store)
    store.close()
    (tmp_path / JOURNAL_NAME).write_bytes(stale_journal)  # as if truncation never happened
    reopened = open_store(tmp_path)
    assert state_of(reopened) == before
    assert reopened.get(entry_id).num_uses == 1
    reopened.close()


def test_kill_9_loses_no_acknowledged_write(tmp_path: Path) -> None:
    rng = random.Random(1234)
    expected_live: set[str] = set()
    deleted: set[str] = set()
    min_counts: dict[str, tuple[int, int]] = {}
    num_acked = 0
    for round_number in range(4):
        lines = _run_writer_and_kill(tmp_path, seed=round_number, after_s=rng.uniform(0.05, 0.5))
        num_acked += len(lines)
        for kind, entry_id, *counts in (line.split() for line in lines):
            if kind == "add":
                expected_live.add(entry_id)
            elif kind == "deleting":
                expected_live.discard(entry_id)
            elif kind == "del":
                deleted.add(entry_id)
            else:
                min_counts[entry_id] = (int(counts[0]), int(counts[1]))
        store = _reopen_writer_store(tmp_path)
        _assert_consistent(store)
        stored = {r.id for r in store.export_records()}
        assert expected_live <= stored
        assert not deleted & stored
        for entry_id, (num_uses, num_successes) in min_counts.items():
            if entry_id in expected_live:  # a later unacknowledged write may have landed too
                assert store.get(entry_id).num_uses >= num_uses
                assert store.get(entry_id).num_successes >= num_successes
        _assert_snapshot_round_trip(store, tmp_path)
    assert num_acked > 20  # the kills really interrupted a busy writer


def _run_writer_and_kill(data_dir: Path, *, seed: int, after_s: float) -> list[str]:
    """Start the writer, SIGKILL it ``after_s`` after it is ready; return its complete ack lines."""
    return _kill_after(data_dir, [sys.executable, str(WRITER), str(data_dir), str(seed)], after_s, group=False)


def _kill_after(data_dir: Path, cmd: list[str], after_s: float, *, group: bool) -> list[str]:
    """Run ``cmd`` until it prints "ready", SIGKILL it (its whole process group with ``group``) ``after_s``
    later, and return the complete lines it printed (the last piece may be a torn line)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT,
                               start_new_session=group)
    try:
        ready = process.stdout.readline()
        assert ready == b"ready\n", process.stderr.read().decode(errors="replace")
        time.sleep(after_s)
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            os.kill(process.pid, signal.SIGKILL)
        out, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    return [line.decode() for line in out.split(b"\n")[:-1]]


def _reopen_writer_store(path: Path) -> ExperienceStore:
    return ExperienceStore.open(path, MemoryConfig(), WRITER_DIM, clock=FakeClock())


def _assert_snapshot_round_trip(store: ExperienceStore, path: Path) -> None:
    """The recovered state is self-consistent: snapshotting and reopening it changes nothing."""
    before = state_of(store)
    store.compact()
    store.close()
    reopened = _reopen_writer_store(path)
    assert state_of(reopened) == before
    reopened.close()


def _assert_consistent(store: ExperienceStore) -> None:
    """Bucket indexes and counters agree with the records."""
    stats = store.stats()
    entries = [r for r in store.export_records() if isinstance(r, MemoryEntry)]
    assert stats.num_entries == len(entries)
    assert sum(b.num_positive + b.num_negative for b in stats.buckets.values()) == len(entries)
    assert all(0 <= e.num_successes <= e.num_uses for e in entries)


def _pair(key_q: np.ndarray) -> MetaPlanPair:
    return MetaPlanPair("pair-1", "q", "good plan", "bad plan", question_embedding=vector_to_bytes(key_q))


def test_kill_9_leftover_snapshot_temp_is_ignored(tmp_path: Path) -> None:
    ids = _fill(tmp_path, 3)
    (tmp_path / (SNAPSHOT_NAME + ".tmp")).write_bytes(b"half a snapshot")
    store = open_store(tmp_path)
    assert all(entry_id in store for entry_id in ids)
    assert not (tmp_path / (SNAPSHOT_NAME + ".tmp")).exists()
    store.close()


def test_a_second_writer_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with pytest.raises(StoreInUse):
        open_store(tmp_path)
    store.close()
    open_store(tmp_path).close()  # free again once the first one is closed


CONCURRENT_WRITER = Path(__file__).with_name("_concurrent_writer.py")
NUM_GROUP_KILLS = 20


@pytest.mark.slow
def test_20_process_group_kills_during_concurrent_writes_of_any_size(tmp_path: Path) -> None:
    """kill -9 of the whole process group while 8 tasks add, import and delete memories of random sizes,
    some over the journal's record limit: those are refused (never acknowledged, never stored), every
    acknowledged write survives, and the store opens after every kill."""
    from ._concurrent_writer import DIM, writer_config

    rng = random.Random(4321)
    expected: set[str] = set()
    deleted: set[str] = set()
    num_acked = num_refused = 0
    for round_number in range(NUM_GROUP_KILLS):
        lines = _run_group_and_kill(tmp_path, seed=round_number, after_s=rng.uniform(0.1, 0.6))
        for kind, *ids in (line.split() for line in lines):
            num_acked += kind in ("add", "import", "del")
            num_refused += kind == "refused"
            if kind in ("add", "import"):
                expected.update(ids)
            elif kind == "deleting":
                expected.difference_update(ids)
            elif kind == "del":
                deleted.update(ids)
        store = ExperienceStore.open(tmp_path, writer_config(), DIM, clock=FakeClock())  # opens every time
        stored = {r.id for r in store.export_records()}
        _assert_consistent(store)
        store.close()
        assert expected <= stored, f"round {round_number}: lost {sorted(expected - stored)[:5]}"
        assert not deleted & stored
        assert all(r.stat().st_mode & 0o077 == 0 for r in tmp_path.iterdir())  # 0600 files
    assert num_acked > 100 and num_refused > 0  # the kills interrupted busy writers, oversized ones included


def _run_group_and_kill(data_dir: Path, *, seed: int, after_s: float) -> list[str]:
    cmd = [sys.executable, "-m", "tests.memory._concurrent_writer", str(data_dir), str(seed)]
    return _kill_after(data_dir, cmd, after_s, group=True)


def test_a_change_over_the_record_limit_is_refused_unwritten(tmp_path: Path) -> None:
    """The bug this guards: a 70 MB add was acknowledged, then replay cut the journal there, losing it and
    every later write."""
    config = MemoryConfig(durability=DurabilityConfig(max_record_bytes=64 * 1024))
    store = open_store(tmp_path, config)
    rng = np.random.default_rng(5)
    small = store.add(make_entry(unit(rng), question="before")).id
    with pytest.raises(RecordTooLarge):
        store.add(make_entry(unit(rng), question="huge", trajectory="x" * (100 * 1024)))
    later = store.add(make_entry(unit(rng), question="after")).id
    size = (tmp_path / JOURNAL_NAME).stat().st_size
    store.close()
    reopened = open_store(tmp_path, config)
    assert small in reopened and later in reopened and len(reopened) == 2
    assert (tmp_path / JOURNAL_NAME).stat().st_size == size  # nothing was cut on replay
    reopened.close()


def test_import_is_written_in_changes_that_replay(tmp_path: Path) -> None:
    config = MemoryConfig(durability=DurabilityConfig(max_record_bytes=64 * 1024))
    store = open_store(tmp_path, config)
    rng = np.random.default_rng(6)
    records = [make_entry(unit(rng), question=f"q{i}", trajectory="y" * 20_000) for i in range(20)]  # ~400 KB
    assert store.import_records(records) == 20
    with pytest.raises(RecordTooLarge):
        store.import_records([make_entry(unit(rng), question="big", trajectory="z" * (80 * 1024))])
    store.close()
    reopened = open_store(tmp_path, config)
    assert len(reopened) == 20
    reopened.close()


def test_a_memory_folder_others_can_write_is_refused_not_reused(tmp_path: Path) -> None:
    """The memory folder is checked like every folder the server writes: one that other users can write
    may hold their files, so the store refuses it (one line naming the field) instead of opening it."""
    data_dir = tmp_path / "memory"
    data_dir.mkdir()
    os.chmod(data_dir, 0o777)
    with pytest.raises(UnsafeFolder, match=r"^server\.data_dir: .*memory"):
        open_store(data_dir)
    assert not (data_dir / JOURNAL_NAME).exists()


def test_files_are_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "memory"
    store = open_store(data_dir)
    store.add(make_entry(unit(np.random.default_rng(7))))
    store.compact()
    store.close()
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert {path.name for path in data_dir.iterdir()} == {JOURNAL_NAME, f"{JOURNAL_NAME}.1", f"{SNAPSHOT_NAME}.1",
                                                          "memory.lock"}
    for path in data_dir.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
