"""Damage in the middle of the journal: replay resynchronises and keeps every valid record after it, the
damaged bytes are copied aside (never deleted), and the store compacts so the next start is clean; text in a
record is never read as a frame. Also: lowering ``max_record_bytes`` keeps older records, and a failing
snapshot never fails a durable write."""

from __future__ import annotations

import errno
import logging
import struct
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pytest

from mia_engine.memory import snapshot as snapshot_module
from mia_engine.config.memory import DurabilityConfig, MemoryConfig, TextLimits
from mia_engine.memory.framing import CORRUPT_SUFFIX, HEADER_SIZE
from mia_engine.memory.journal import JOURNAL_HEADER, JOURNAL_NAME
from mia_engine.memory.validation import TextTooLong

from .factories import FakeClock, make_entry, memory_config, open_store, unit

JOURNAL_LOGGER = "mia_engine.memory.recovery"


def _fill(path: Path, num_entries: int, config: MemoryConfig | None = None, **fields: object) -> list[str]:
    rng = np.random.default_rng(0)
    store = open_store(path, config)
    ids = [store.add(make_entry(unit(rng), question=f"q{i}", **fields)).id for i in range(num_entries)]
    store.close()
    return ids


def _frame_offsets(data: bytes) -> list[int]:
    """Where each frame of a journal segment starts (its 0xFF, the only one: framing.py), then its length."""
    offsets, offset = [], data.find(b"\xff")
    while offset >= 0:
        offsets.append(offset)
        offset = data.find(b"\xff", offset + 1)
    return offsets + [len(data)]


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
    flip = {"third": third, "length": start + 1, "crc": start + HEADER_SIZE - 2, "payload_end": end - 1}[where]
    assert data[flip] != 0xFF  # a frame's own 0xFF: see the next test
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
    assert snapshot_module.generations(tmp_path)  # compacted: the damage is out of the active journal

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


def test_a_damaged_frame_start_loses_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A frame whose 0xFF was hit is found where the frame before it ends (its length says where)."""
    ids = _fill(tmp_path, 10)
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    data[_frame_offsets(bytes(data))[4]] ^= 0x40
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=JOURNAL_LOGGER):
        store = open_store(tmp_path)
    assert all(entry_id in store for entry_id in ids) and _warnings(caplog) == [] and _side_files(tmp_path) == []
    store.close()


def test_a_record_holding_the_bytes_of_a_frame_is_never_read_as_one(tmp_path: Path) -> None:
    """Text is stored as raw UTF-8, and a client can send any character (JSON "\\u0000" included): a frame of
    the previous format (no 0xFF in it), crafted to be valid UTF-8, with a seq far above the store's, sat in
    a stored trajectory; once the record holding it was damaged, the resync scan took it, and dropped every
    later record as older. Frames now start with 0xFF, which UTF-8 never holds."""
    rng = np.random.default_rng(8)
    fake, fake_seq = _utf8_frame_of_the_previous_format()
    store = open_store(tmp_path)
    before = store.add(make_entry(unit(rng), question="before")).id
    holder = store.add(make_entry(unit(rng), question="holder", trajectory=f"see {fake} here")).id
    after = [store.add(make_entry(unit(rng), question=f"after {i}")).id for i in range(3)]
    store.close()
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    assert fake.encode() in data
    data[_frame_offsets_any(bytes(data))[1] + 1] ^= 0x04  # the holder's length field
    path.write_bytes(bytes(data))
    reopened = open_store(tmp_path)
    assert holder not in reopened and before in reopened and all(entry_id in reopened for entry_id in after)
    assert reopened.stats().journal_seq == 5 != fake_seq
    reopened.close()


def _utf8_frame_of_the_previous_format() -> tuple[str, int]:
    """A frame ``<u32 length><u32 crc32(length ‖ payload)><Change(seq)>`` whose bytes are valid UTF-8."""
    legacy = struct.Struct("<II")
    for seq in range(0x80000000, 0x80000000 + 1_000_000, 257):
        payload = msgspec.msgpack.encode({"seq": seq})
        length = struct.pack("<I", len(payload))
        frame = legacy.pack(len(payload), zlib.crc32(payload, zlib.crc32(length))) + payload
        try:
            return frame.decode("utf-8"), seq
        except UnicodeDecodeError:
            continue
    raise AssertionError("no UTF-8 frame found")


def _frame_offsets_any(data: bytes) -> list[int]:
    """Frame starts of a journal of either format (this test also runs against the previous one)."""
    if data.startswith(JOURNAL_HEADER):
        return _frame_offsets(data)
    legacy, offsets, offset = struct.Struct("<II"), [], 0
    while offset < len(data):
        offsets.append(offset)
        offset += legacy.size + legacy.unpack_from(data, offset)[0]
    return offsets


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
    """Fault injection: the background snapshot write raises (a full disk). Every add still succeeds, the
    snapshot is retried after ``snapshot_retry_s`` (not on every write), and a later success compacts."""
    attempts: list[int] = []
    real_write = snapshot_module.write_generation

    def failing_write(data_dir: Path, snapshot: snapshot_module.Snapshot) -> Path:
        attempts.append(snapshot.seq)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshot_module, "write_generation", failing_write)
    config = MemoryConfig(durability=DurabilityConfig(snapshot_interval=2, snapshot_retry_s=100.0))
    clock = FakeClock()
    store = open_store(tmp_path, config, clock=clock)
    rng = np.random.default_rng(4)

    def add(question: str) -> str:  # and wait for the snapshot it may have started: a deterministic schedule
        entry_id = store.add(make_entry(unit(rng), question=question)).id
        store.wait_for_snapshot()
        return entry_id

    ids = [add(f"q{i}") for i in range(10)]
    assert attempts == [2]  # tried once, then waits: the clock has moved ~20 s of its 100
    clock.now += 100
    ids.append(add("retry"))
    assert attempts == [2, 11]  # retried once the wait is over, failed again: the next wait doubles
    clock.now += 150
    ids.append(add("still waiting"))
    assert attempts == [2, 11]
    monkeypatch.setattr(snapshot_module, "write_generation", real_write)
    clock.now += 100
    ids.append(add("succeeds"))
    assert store.stats().num_records_since_snapshot == 0 and snapshot_module.generations(tmp_path)
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
