"""Crash safety of the store: an append-only journal of changes plus periodic snapshots.

On disk, under the data dir:
- ``memory.journal``: frames ``<u32 length><u32 crc32(length ‖ payload)><payload>``, each payload
  one msgpack ``Change``. A write is acknowledged after its frame is written (and fsynced, by
  default), so an acknowledged change survives ``kill -9``. A change larger than
  ``max_record_bytes`` (which replay would refuse) is refused before it is written. A torn or
  corrupt tail (a crash mid write, a bad sector) fails the length or CRC check: it is moved aside
  to ``memory.journal.corrupt-<unix time>`` (never deleted) and the log says so, once.
- ``memory.snapshot``: one frame holding the whole state and the ``seq`` of the last change it
  includes; written to a temp file, fsynced and renamed over the old one, then the journal is
  emptied. Changes with ``seq`` at or below the snapshot's are skipped on replay, so a crash
  between the rename and the truncation replays nothing twice.

Files are created 0600 and the folder 0700 (memories can hold anything a user asked); every rename
and creation is followed by an fsync of the folder.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib
from pathlib import Path

import msgspec

from ..base.files import fsync_dir, write_file_atomic
from .config import DurabilityConfig
from .entries import MemoryEntry, MemoryStoreError, MetaPlanPair, RecordTooLarge

logger = logging.getLogger(__name__)

JOURNAL_NAME = "memory.journal"
SNAPSHOT_NAME = "memory.snapshot"
_HEADER = struct.Struct("<II")  # payload length, crc32
_SNAPSHOT_FORMAT = 1
_FILE_MODE = 0o600
_DIR_MODE = 0o700
CORRUPT_SUFFIX = ".corrupt-"


class CorruptSnapshot(MemoryStoreError):
    """The snapshot fails its CRC: not a torn write (those never reach the renamed file), so refuse
    to start rather than silently serve an empty memory."""


class StoreInUse(MemoryStoreError):
    """Another live process has this data dir open; two writers would interleave their journals."""


class CountUpdate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """New absolute counters of one memory (absolute, so replaying a change twice is harmless)."""

    id: str
    num_uses: int
    num_successes: int
    updated_at: float


class Change(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One atomic mutation of the store: the unit of logging, acknowledgement and replay."""

    seq: int
    put_entries: list[MemoryEntry] = []
    delete_entries: list[str] = []
    counts: list[CountUpdate] = []
    put_meta_plans: list[MetaPlanPair] = []
    delete_meta_plans: list[str] = []
    cleared_at: float | None = None
    """Set by a selective clearing; "drop_unused" only drops memories older than the last one."""


class Snapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole store as of change ``seq``."""

    seq: int
    dim: int
    entries: list[MemoryEntry]
    meta_plans: list[MetaPlanPair]
    last_clear_at: float | None = None
    format: int = _SNAPSHOT_FORMAT


class Recovered(msgspec.Struct, frozen=True):
    """What ``Journal.open`` found on disk: the snapshot (if any) and the changes to replay after it."""

    snapshot: Snapshot | None
    changes: list[Change]


class Journal:
    """Owns the two files; not thread-safe (the store calls it from one thread)."""

    def __init__(self, data_dir: Path, config: DurabilityConfig, fd: int, size: int) -> None:
        self._data_dir = data_dir
        self._config = config
        self._fd = fd
        self._size = size
        self._encoder = msgspec.msgpack.Encoder()

    @classmethod
    def open(cls, data_dir: Path, config: DurabilityConfig) -> tuple[Journal, Recovered]:
        """Lock the data dir, read snapshot and journal, cut a torn tail, and open the journal for appending."""
        _make_private_dir(data_dir)
        path = data_dir / JOURNAL_NAME
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _FILE_MODE)
        try:
            _lock(fd, path)
            os.fchmod(fd, _FILE_MODE)  # journals written by older versions were 0644
            (data_dir / (SNAPSHOT_NAME + ".tmp")).unlink(missing_ok=True)  # a snapshot that never got renamed
            snapshot = _read_snapshot(data_dir / SNAPSHOT_NAME, config)
            changes, valid_size = _read_journal(path, config)
            if os.fstat(fd).st_size != valid_size:
                _set_aside_tail(path, valid_size, len(changes))
                os.ftruncate(fd, valid_size)
                os.fsync(fd)
            fsync_dir(data_dir)
        except BaseException:
            os.close(fd)
            raise
        floor = snapshot.seq if snapshot is not None else 0
        return cls(data_dir, config, fd, valid_size), Recovered(snapshot, [c for c in changes if c.seq > floor])

    @property
    def num_bytes(self) -> int:
        return self._size

    @property
    def max_record_bytes(self) -> int:
        return self._config.max_record_bytes

    def append(self, change: Change) -> None:
        """Durable once this returns; on failure the partial frame is cut so later frames stay readable.

        A change replay would refuse (over ``max_record_bytes``) raises ``RecordTooLarge`` unwritten."""
        payload = self._encoder.encode(change)
        if len(payload) > self._config.max_record_bytes:
            raise RecordTooLarge(f"this change takes {len(payload)} bytes in the memory journal; the limit is "
                                 f"{self._config.max_record_bytes} (memory.durability.max_record_bytes)")
        frame = _frame(payload)
        try:
            _write_all(self._fd, frame)
            if self._config.fsync == "always":
                os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(frame)

    def write_snapshot(self, snapshot: Snapshot) -> None:
        """Atomically replace the snapshot, then empty the journal it makes redundant."""
        # fsynced whatever memory.durability.fsync says: the journal is truncated next, the snapshot must
        # be on disk first (its temp file, <name>.tmp, is removed by the next open if a crash left it)
        write_file_atomic(self._data_dir / SNAPSHOT_NAME, _frame(self._encoder.encode(snapshot)), mode=_FILE_MODE)
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self._size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<I", len(payload))
    return _HEADER.pack(len(payload), zlib.crc32(payload, zlib.crc32(length))) + payload


def _frames(data: bytes, max_record_bytes: int) -> tuple[list[tuple[bytes, int]], int]:
    """[(payload, end offset)] of the valid prefix of ``data`` and the end of that prefix."""
    frames, offset = [], 0
    while len(data) - offset >= _HEADER.size:
        length, crc = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if length > max_record_bytes or end > len(data):
            break
        payload = data[offset + _HEADER.size : end]
        if zlib.crc32(payload, zlib.crc32(struct.pack("<I", length))) != crc:
            break
        frames.append((payload, end))
        offset = end
    return frames, offset


def _read_journal(path: Path, config: DurabilityConfig) -> tuple[list[Change], int]:
    """Complete changes and the byte size they span (anything after is the caller's to set aside)."""
    data = path.read_bytes() if path.exists() else b""
    frames, valid_size = _frames(data, config.max_record_bytes)
    decoder = msgspec.msgpack.Decoder(Change)
    changes: list[Change] = []
    for payload, end in frames:
        try:
            changes.append(decoder.decode(payload))
        except msgspec.DecodeError:  # CRC fine but not a Change: treat like corruption from here on
            valid_size = end - len(payload) - _HEADER.size
            break
    return changes, valid_size


def _set_aside_tail(path: Path, valid_size: int, num_kept: int) -> Path:
    """Copy the bytes after the valid prefix to a private side file (durably) before the journal is cut."""
    aside = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{time.time_ns()}")
    with open(path, "rb") as source, open(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE),
                                          "wb") as target:
        source.seek(valid_size)
        num_bytes = 0
        while chunk := source.read(1 << 20):
            target.write(chunk)
            num_bytes += len(chunk)
        target.flush()
        os.fsync(target.fileno())
    fsync_dir(path.parent)
    logger.warning(
        "memory journal %s: a torn or corrupt tail of %d bytes at offset %d was moved aside to %s; "
        "kept %d complete records",
        path, num_bytes, valid_size, aside.name, num_kept,
    )
    return aside


def _read_snapshot(path: Path, config: DurabilityConfig) -> Snapshot | None:
    if not path.exists():
        return None
    data = path.read_bytes()
    frames, end = _frames(data, max(config.max_record_bytes, len(data)))
    if len(frames) != 1 or end != len(data):
        raise CorruptSnapshot(f"memory snapshot {path} fails its length/CRC check")
    try:
        snapshot = msgspec.msgpack.decode(frames[0][0], type=Snapshot)
    except msgspec.DecodeError as err:
        raise CorruptSnapshot(f"memory snapshot {path} cannot be decoded: {err}") from None
    if snapshot.format != _SNAPSHOT_FORMAT:
        raise CorruptSnapshot(f"memory snapshot {path} has format {snapshot.format}, expected {_SNAPSHOT_FORMAT}")
    return snapshot


def _lock(fd: int, path: Path) -> None:
    """Exclusive advisory lock for the life of the fd; the kernel drops it when a process dies (kill -9)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StoreInUse(f"{path} is open in another process") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _make_private_dir(path: Path) -> None:
    existed = path.is_dir()
    path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, _DIR_MODE)
    if not existed:
        fsync_dir(path.parent)
