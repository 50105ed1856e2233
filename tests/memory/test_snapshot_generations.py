"""Snapshot generations: written in parts off the store's thread, the previous generation kept with the
journal since it, a damaged part losing only its own records, a start that never refuses because of a
snapshot; a change that fails to apply never replays; data dirs of the previous format still open."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from mia_engine.memory import snapshot as snapshot_module
from mia_engine.memory.contents import StoreContents
from mia_engine.memory.framing import CORRUPT_SUFFIX
from mia_engine.memory.journal import JOURNAL_NAME, SNAPSHOT_NAME, Change, Journal, sealed_segments
from mia_engine.memory.legacy import legacy_frame
from mia_engine.memory.snapshot import generations

from .factories import DIM, make_entry, memory_config, open_store, state_of, unit

LOGGER = "mia_engine.memory.recovery"
PART_RECORDS = 4


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_module, "SNAPSHOT_PART_RECORDS", PART_RECORDS)


def _two_generations(path: Path, num_after: int = 3) -> tuple[list[str], list[bytes]]:
    """10 memories, a snapshot, 10 more, a snapshot (at seq 10 and 20), ``num_after`` more in the journal."""
    rng = np.random.default_rng(0)
    store = open_store(path)
    ids = [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(10)]
    store.compact()
    ids += [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(10, 20)]
    store.compact()
    ids += [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(20, 20 + num_after)]
    state = state_of(store)
    store.close()
    assert [seq for seq, _ in generations(path)] == [10, 20]
    assert [seq for seq, _ in sealed_segments(path)] == [20]  # the segment up to 10 is retired
    return ids, state


def _part_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    return [i for i in range(len(data)) if data[i] == 0xFF] + [len(data)]


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_a_snapshot_is_written_in_parts(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    rng = np.random.default_rng(5)
    for i in range(30):
        store.add(make_entry(unit(rng), question=f"q{i}"))
    before = state_of(store)
    store.compact()
    store.close()
    [(_, path)] = generations(tmp_path)
    assert len(_part_offsets(path)) == 1 + 8  # 30 records in parts of 4
    reopened = open_store(tmp_path)
    assert state_of(reopened) == before
    reopened.close()


def test_a_damaged_part_loses_only_its_records(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Both generations damaged (so neither the previous one nor the journal can stand in): the newest loads
    less its damaged part, the log says what was lost, the damage is copied aside, the next start is clean."""
    ids, _ = _two_generations(tmp_path)
    newest, previous = generations(tmp_path)[1][1], generations(tmp_path)[0][1]
    offsets = _part_offsets(newest)
    data = bytearray(newest.read_bytes())
    data[(offsets[1] + offsets[2]) // 2] ^= 0x01  # inside part 1: memories 4..7
    newest.write_bytes(bytes(data))
    previous.write_bytes(previous.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        store = open_store(tmp_path)
    assert [entry_id in store for entry_id in ids] == [not 4 <= i < 8 for i in range(23)]
    log = "\n".join(_errors(caplog))
    assert "parts [1] cannot be read: 4 memories" in log and "lost 4 memories and 0 Meta Plan pairs" in log
    store.close()
    assert any(p.name.startswith(newest.name + CORRUPT_SUFFIX) for p in tmp_path.iterdir())
    assert not newest.exists() and not previous.exists()  # replaced by a clean generation
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reopened = open_store(tmp_path)
    assert len(reopened) == 19 and _errors(caplog) == []
    reopened.close()


@pytest.mark.parametrize("damage", ["part", "unreadable", "missing"])
def test_the_previous_generation_stands_in_for_a_damaged_newest(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                damage: str) -> None:
    ids, state = _two_generations(tmp_path)
    newest = generations(tmp_path)[1][1]
    if damage == "part":
        data = bytearray(newest.read_bytes())
        data[_part_offsets(newest)[2] + 20] ^= 0x01
        newest.write_bytes(bytes(data))
    elif damage == "unreadable":
        newest.write_bytes(b"\0" * newest.stat().st_size)
    else:
        newest.unlink()  # as if a crash came between the snapshot's rename and the folder's fsync
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        store = open_store(tmp_path)
    assert state_of(store) == state and len(store) == len(ids)
    assert damage == "missing" or "nothing was lost" in "\n".join(_errors(caplog))
    store.add(make_entry(unit(np.random.default_rng(1)), question="after"))
    store.close()
    reopened = open_store(tmp_path)
    assert len(reopened) == len(ids) + 1
    reopened.close()


def test_a_crash_before_the_new_generation_is_renamed_loses_nothing(tmp_path: Path) -> None:
    """The journal is sealed, the snapshot's temp file half written: the newest durable generation and every
    segment after it are read; the temp file is removed."""
    ids, state = _two_generations(tmp_path)
    store = open_store(tmp_path)
    store.add(make_entry(unit(np.random.default_rng(2)), question="last"))
    state = state_of(store)
    store._journal.seal(24)  # what a periodic snapshot does first, on the store's thread
    store.close()
    (tmp_path / f"{SNAPSHOT_NAME}.24.tmp").write_bytes(b"MIA memory snapshot 3\n\xff\x01")
    reopened = open_store(tmp_path)
    assert state_of(reopened) == state and not (tmp_path / f"{SNAPSHOT_NAME}.24.tmp").exists()
    reopened.close()


def test_writes_and_searches_do_not_wait_for_a_snapshot_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot is written on a thread of its own: held there, it stalls no write and no search."""
    started, release = threading.Event(), threading.Event()
    real_write = snapshot_module.write_generation

    def slow_write(data_dir: Path, snapshot: snapshot_module.Snapshot) -> Path:
        started.set()
        release.wait(timeout=5)
        return real_write(data_dir, snapshot)

    monkeypatch.setattr(snapshot_module, "write_generation", slow_write)
    store = open_store(tmp_path, memory_config(snapshot_interval=3))
    rng = np.random.default_rng(3)
    began = time.monotonic()
    ids = [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(6)]  # the 3rd starts one
    hits = store.search(unit(rng), None, store.bucket_key("text", None), num_positive=2, num_negative=0)
    assert started.is_set() and not release.is_set() and time.monotonic() - began < 2.5
    assert len(hits.positives) == 2
    release.set()
    store.close()  # waits for the write
    reopened = open_store(tmp_path)
    assert all(entry_id in reopened for entry_id in ids) and [seq for seq, _ in generations(tmp_path)] == [3]
    reopened.close()


def test_a_change_that_fails_to_apply_is_withdrawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its frame was journaled, then applying it failed: it is cut (never acknowledged, never replayed), so the
    next change can take its seq; replay used to apply the failed change, and both shared one seq."""
    store = open_store(tmp_path)
    rng = np.random.default_rng(4)
    first = store.add(make_entry(unit(rng), question="first")).id
    _fail_next_apply(monkeypatch)
    with pytest.raises(RuntimeError, match="injected"):
        store.add(make_entry(unit(rng), question="fails"))
    later = store.add(make_entry(unit(rng), question="later")).id
    store.close()
    reopened = open_store(tmp_path)
    assert sorted(e.question for e in reopened.export_records()) == ["first", "later"]
    assert first in reopened and later in reopened and reopened.stats().journal_seq == 2
    reopened.close()


def test_a_failed_change_that_cannot_be_withdrawn_uses_up_its_seq(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where cutting the frame fails too, the frame stays (it replays) and the next change gets the next seq."""
    store = open_store(tmp_path)
    rng = np.random.default_rng(6)
    _fail_next_apply(monkeypatch)

    def failing_retract(self: Journal) -> None:
        raise OSError("injected: read-only file system")

    monkeypatch.setattr(Journal, "retract", failing_retract)
    with pytest.raises(RuntimeError, match="injected"):
        store.add(make_entry(unit(rng), question="fails"))
    later = store.add(make_entry(unit(rng), question="later")).id
    store.close()
    reopened = open_store(tmp_path)
    assert sorted(e.question for e in reopened.export_records()) == ["fails", "later"]
    assert later in reopened and reopened.stats().journal_seq == 2
    reopened.close()


def _fail_next_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    real_apply = StoreContents.apply
    calls: list[int] = []

    def apply_once_failing(self: StoreContents, change: Change) -> None:
        calls.append(change.seq)
        if len(calls) == 1:
            raise RuntimeError("injected: applying this change failed")
        real_apply(self, change)

    monkeypatch.setattr(StoreContents, "apply", apply_once_failing)


class _SnapshotV1(msgspec.Struct):
    seq: int
    dim: int
    entries: list
    meta_plans: list
    last_clear_at: float | None = None
    format: int = 1


class _HeadV2(msgspec.Struct):
    format: int
    seq: int
    dim: int
    num_entries: int
    num_meta_plans: int
    last_clear_at: float | None = None


class _PartV2(msgspec.Struct):
    entries: list = []
    meta_plans: list = []


@pytest.mark.parametrize("form", [1, 2])
def test_a_data_dir_of_the_previous_format_opens_and_is_carried_over(tmp_path: Path, form: int) -> None:
    """``memory.snapshot`` (format 1 or 2) and a ``memory.journal`` without a header, as the previous version
    wrote them: the store opens with every record, and two snapshots later the old files are retired."""
    rng = np.random.default_rng(7)
    entries = [make_entry(unit(rng), question=f"q{i}") for i in range(9)]
    if form == 1:
        snapshot = legacy_frame(msgspec.msgpack.encode(_SnapshotV1(6, DIM, entries[:6], [])))
    else:
        snapshot = legacy_frame(msgspec.msgpack.encode(_HeadV2(2, 6, DIM, 6, 0))) + b"".join(
            legacy_frame(msgspec.msgpack.encode(_PartV2(entries[i:i + 4]))) for i in (0, 4))
    (tmp_path / SNAPSHOT_NAME).write_bytes(snapshot)
    journal = [Change(5, put_entries=[entries[5]])]  # at or below the snapshot's seq: a truncation never done
    journal += [Change(seq, put_entries=[entries[seq - 1]]) for seq in (7, 8, 9)]
    (tmp_path / JOURNAL_NAME).write_bytes(b"".join(legacy_frame(msgspec.msgpack.encode(c)) for c in journal))
    store = open_store(tmp_path)
    assert sorted(e.question for e in store.export_records()) == [f"q{i}" for i in range(9)]
    state = state_of(store)
    store.compact()
    store.close()
    reopened = open_store(tmp_path)
    assert state_of(reopened) == state
    reopened.add(make_entry(unit(rng), question="later"))
    reopened.compact()
    reopened.close()
    names = {path.name for path in tmp_path.iterdir()}
    assert SNAPSHOT_NAME not in names and f"{JOURNAL_NAME}.9" not in names  # retired by two generations


def test_a_damaged_snapshot_of_the_previous_format_does_not_refuse_to_start(tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """It used to refuse (``CorruptSnapshot``): the parts before the damage load, the log says what was lost."""
    rng = np.random.default_rng(8)
    entries = [make_entry(unit(rng), question=f"q{i}") for i in range(8)]
    parts = [legacy_frame(msgspec.msgpack.encode(_PartV2(entries[i:i + 4]))) for i in (0, 4)]
    data = bytearray(legacy_frame(msgspec.msgpack.encode(_HeadV2(2, 8, DIM, 8, 0))) + b"".join(parts))
    data[-10] ^= 0x01
    (tmp_path / SNAPSHOT_NAME).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        store = open_store(tmp_path)
    assert sorted(e.question for e in store.export_records()) == [f"q{i}" for i in range(4)]
    assert "lost 4 memories and 0 Meta Plan pairs" in "\n".join(_errors(caplog))
    store.close()
