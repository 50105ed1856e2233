"""Damage in the middle of the journal: replay resynchronises and keeps every valid record after it, the
damaged bytes are copied aside (never deleted), and the store compacts so the next start is clean. Also:
lowering ``max_record_bytes`` keeps older records, and a failing snapshot never fails a durable write."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import msgspec
import numpy as np
import pytest

from mia_engine.memory import journal as journal_module
from mia_engine.config.memory import DurabilityConfig, MemoryConfig, TextLimits
from mia_engine.memory.journal import CORRUPT_SUFFIX, JOURNAL_NAME, SNAPSHOT_NAME, Change
from mia_engine.memory.validation import TextTooLong

from .factories import FakeClock, make_entry, memory_config, open_store, state_of, unit

JOURNAL_LOGGER = "mia_engine.memory.journal"
_HEADER = struct.Struct("<II")


def _fill(path: Path, num_entries: int, config: MemoryConfig | None = None, **fields: object) -> list[str]:
    rng = np.random.default_rng(0)
    store = open_store(path, config)
    ids = [store.add(make_entry(unit(rng), question=f"q{i}", **fields)).id for i in range(num_entries)]
    store.close()
    return ids


def _frame_offsets(data: bytes) -> list[int]:
    offsets, offset = [], 0
    while offset < len(data):
        offsets.append(offset)
        offset += _HEADER.size + _HEADER.unpack_from(data, offset)[0]
    return offsets


def _side_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.startswith(JOURNAL_NAME + CORRUPT_SUFFIX))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == JOURNAL_LOGGER and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("where", ["third", "length", "crc", "payload_end"])
def test_one_flipped_byte_loses_only_its_record(tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str) -> None:
    """The issue's reproduction: 30 acknowledged adds, one byte flipped a third of the way in (or in the
    length field, CRC or last payload byte of the frame there): 29 survive, the damaged bytes are kept."""
    ids = _fill(tmp_path, 30)
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    offsets = _frame_offsets(bytes(data))
    third = len(data) // 3
    damaged = max(i for i, offset in enumerate(offsets) if offset <= third)
    start, end = offsets[damaged], offsets[damaged + 1]
    flip = {"third": third, "length": start + 1, "crc": start + 5, "payload_end": end - 1}[where]
    data[flip] ^= 0x40
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        store = open_store(tmp_path)
    kept = [entry_id in store for entry_id in ids]
    assert kept == [i != damaged for i in range(30)]
    store.add(make_entry(unit(np.random.default_rng(9)), question="after the repair"))
    store.close()

    [side] = _side_files(tmp_path)
    assert side.read_bytes() == bytes(data[start:end])  # exactly the damaged record, as it was on disk
    assert side.stat().st_mode & 0o777 == 0o600
    [message] = _warnings(caplog)
    assert f"{end - start} bytes at offset {start}" in message and side.name in message
    assert (tmp_path / SNAPSHOT_NAME).exists()  # compacted: the damage is out of the journal

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        reopened = open_store(tmp_path)
    assert _warnings(caplog) == [] and len(reopened) == 30 and _side_files(tmp_path) == [side]
    reopened.close()


def test_several_damaged_runs_and_a_torn_tail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ids = _fill(tmp_path, 12)
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    offsets = _frame_offsets(bytes(data))
    data[offsets[3] + 20] ^= 0xFF
    data[offsets[4] + 2] ^= 0x10  # two neighbours: one run
    data[offsets[8] + 30] ^= 0xFF
    del data[-5:]  # and a torn tail
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        store = open_store(tmp_path)
    assert [entry_id in store for entry_id in ids] == [i not in (3, 4, 8, 11) for i in range(12)]
    store.close()
    sizes = sorted(side.stat().st_size for side in _side_files(tmp_path))
    assert sizes == sorted([offsets[5] - offsets[3], offsets[9] - offsets[8], len(data) - offsets[11]])
    assert len(_warnings(caplog)) == 3


def test_a_valid_but_older_frame_after_damage_is_not_resynchronised_onto(tmp_path: Path) -> None:
    """A frame found by scanning must carry a later seq than the last kept one: a stray copy of an old,
    CRC-valid frame (or one embedded in damaged bytes) is skipped with the damage."""
    ids = _fill(tmp_path, 6)
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    offsets = _frame_offsets(bytes(data))
    old_frame = bytes(data[offsets[0]:offsets[1]])  # seq 1
    data[offsets[3] + 20] ^= 0xFF
    data[offsets[4]:offsets[4]] = old_frame
    path.write_bytes(bytes(data))
    store = open_store(tmp_path)
    assert [entry_id in store for entry_id in ids] == [True, True, True, False, True, True]
    assert store.stats().journal_seq == 6
    store.close()
    [side] = _side_files(tmp_path)
    assert side.stat().st_size == offsets[4] - offsets[3] + len(old_frame)


def test_resync_checks_only_plausible_frame_starts() -> None:
    """The scan's prefilter relies on how msgspec lays out a Change: a fixmap whose first key is "seq"."""
    payload = msgspec.msgpack.encode(Change(7, delete_entries=["x"], cleared_at=1.0))
    assert payload[0] & 0xF0 == 0x80 and payload[1:5] == msgspec.msgpack.encode("seq")


def test_lowering_max_record_bytes_keeps_older_larger_records(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(3)
    store = open_store(tmp_path)  # the default limit, 64 MiB
    big = store.add(make_entry(unit(rng), question="big", trajectory="t" * (200 * 1024))).id
    later = store.add(make_entry(unit(rng), question="later")).id
    store.close()
    size = (tmp_path / JOURNAL_NAME).stat().st_size
    lowered = MemoryConfig(durability=DurabilityConfig(max_record_bytes=64 * 1024))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        reopened = open_store(tmp_path, lowered)
    assert big in reopened and later in reopened and _warnings(caplog) == []
    assert (tmp_path / JOURNAL_NAME).stat().st_size == size and _side_files(tmp_path) == []
    reopened.close()


def test_a_failing_snapshot_never_fails_a_durable_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the snapshot writer raises what a u32 length overflow raises. Every add still
    succeeds, the snapshot is retried after ``snapshot_retry_s`` (not on every write), and a later
    success compacts."""
    attempts: list[int] = []
    real_write = journal_module.Journal.write_snapshot

    def failing_write(self: journal_module.Journal, snapshot: journal_module.Snapshot) -> None:
        attempts.append(snapshot.seq)
        raise struct.error("'I' format requires 0 <= number <= 4294967295")

    monkeypatch.setattr(journal_module.Journal, "write_snapshot", failing_write)
    config = MemoryConfig(durability=DurabilityConfig(snapshot_interval=2, snapshot_retry_s=100.0))
    clock = FakeClock()
    store = open_store(tmp_path, config, clock=clock)
    rng = np.random.default_rng(4)
    ids = [store.add(make_entry(unit(rng), question=f"q{i}")).id for i in range(10)]
    assert attempts == [2]  # tried once, then waits: the clock has moved ~20 s of its 100
    clock.now += 100
    ids.append(store.add(make_entry(unit(rng), question="retry")).id)
    assert attempts == [2, 11]  # retried once the wait is over, failed again: the next wait doubles
    clock.now += 150
    ids.append(store.add(make_entry(unit(rng), question="still waiting")).id)
    assert attempts == [2, 11]
    monkeypatch.setattr(journal_module.Journal, "write_snapshot", real_write)
    clock.now += 100
    ids.append(store.add(make_entry(unit(rng), question="succeeds")).id)
    assert store.stats().num_records_since_snapshot == 0 and (tmp_path / SNAPSHOT_NAME).exists()
    store.close()
    reopened = open_store(tmp_path, config)
    assert all(entry_id in reopened for entry_id in ids) and len(reopened) == 13
    reopened.close()


def test_text_fields_over_their_cap_are_refused_naming_the_field(tmp_path: Path) -> None:
    config = memory_config(text_limits=TextLimits(max_question_chars=100, max_trajectory_chars=1000))
    store = open_store(tmp_path, config)
    rng = np.random.default_rng(5)
    with pytest.raises(TextTooLong, match=r"question is 101 characters.*memory\.text_limits\.max_question_chars"):
        store.add(make_entry(unit(rng), question="q" * 101))
    with pytest.raises(TextTooLong) as err:
        store.import_records([make_entry(unit(rng), trajectory="t" * 1001)])
    assert err.value.field == "trajectory"
    store.add(make_entry(unit(rng), question="q" * 100, trajectory="t" * 1000))
    store.close()
    lowered = memory_config(text_limits=TextLimits(max_question_chars=10))
    reopened = open_store(tmp_path, lowered)  # limits apply to writes, never to what is stored
    assert len(reopened) == 1
    reopened.close()


def test_a_snapshot_larger_than_one_frame_can_say_is_written_in_parts(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame's length is a u32: one frame holding the whole store failed past 4 GiB (and kept the whole
    encoded store in memory twice). Scaled down: frames capped at 16 KiB, a store of over 6x that, 8 records a
    part."""
    monkeypatch.setattr(journal_module, "MAX_FRAME_BYTES", 16 << 10)
    monkeypatch.setattr(journal_module, "SNAPSHOT_PART_RECORDS", 8)
    config = MemoryConfig(durability=DurabilityConfig(snapshot_interval=10_000))
    store = open_store(tmp_path, config)
    rng = np.random.default_rng(5)
    for i in range(60):
        store.add(make_entry(unit(rng), question=f"q{i} " + "x" * 1500))
    before = state_of(store)
    store.compact()
    store.close()
    data = (tmp_path / SNAPSHOT_NAME).read_bytes()
    assert len(data) > 6 * (16 << 10) and len(_frame_offsets(data)) == 1 + 8  # the head, then 8 parts
    reopened = open_store(tmp_path, config)
    assert state_of(reopened) == before
    reopened.close()


def test_a_snapshot_of_the_first_format_still_opens_and_a_missing_part_refuses_to_start(tmp_path: Path,
                                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "SNAPSHOT_PART_RECORDS", 4)
    store = open_store(tmp_path)
    rng = np.random.default_rng(6)
    for i in range(10):
        store.add(make_entry(unit(rng), question=f"q{i}"))
    store.compact()
    before = state_of(store)
    store.close()
    path = tmp_path / SNAPSHOT_NAME
    snapshot = journal_module._read_snapshot(path)
    assert snapshot is not None
    path.write_bytes(journal_module._frame(msgspec.msgpack.encode(msgspec.structs.replace(snapshot, format=1))))
    reopened = open_store(tmp_path)
    assert state_of(reopened) == before
    reopened.compact()  # rewritten in the current format
    reopened.close()
    data = path.read_bytes()
    offsets = _frame_offsets(data)
    assert len(offsets) == 1 + 3
    path.write_bytes(data[: offsets[2]] + data[offsets[3]:])  # a part dropped (not a torn write: renames are atomic)
    with pytest.raises(journal_module.CorruptSnapshot, match="holds 6 memories and 0 Meta Plan pairs; its head says 10"):
        open_store(tmp_path)
