"""Crash safety of the store: an append-only journal of changes plus periodic snapshots.

On disk, under the data dir:
- ``memory.journal``: frames ``<u32 length><u32 crc32(length ‖ payload)><payload>``, each payload
  one msgpack ``Change``. A write is acknowledged after its frame is written (and fsynced, by
  default), so an acknowledged change survives ``kill -9``. A change larger than
  ``max_record_bytes`` is refused before it is written; replay accepts a frame of any length that
  fits the file and passes its CRC, so lowering the limit never drops an older record.
  Replay resynchronises past damage: after a frame that fails its check it looks for the next
  frame that passes the CRC, decodes as a ``Change`` and carries a later ``seq``, and keeps every
  valid frame after it. Each skipped run of bytes is copied to ``memory.journal.corrupt-<unix
  time ns>-at-<offset>`` (never deleted) and logged with its offset and size; the store then
  compacts, so the next start is clean. Damage with no valid frame after it (a torn tail: a crash
  mid write) is copied aside the same way and cut.
- ``memory.snapshot``: frames of the same kind: a head (``SnapshotHead``: the ``seq`` of the last
  change it includes and how many records follow), then the records in parts of at most
  ``SNAPSHOT_PART_RECORDS`` (``SnapshotPart``), so no frame nears the u32 length however large the
  store grows and the file is written a part at a time; written to a temp file, fsynced and renamed
  over the old one, then the journal is emptied. A snapshot of the first format (one frame holding
  the whole state) is still read. Changes with ``seq`` at or below the snapshot's are skipped on
  replay, so a crash between the rename and the truncation replays nothing twice.

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
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import msgspec

from ..base.files import fsync_dir, private_dir, write_file_atomic
from ..config.memory import DurabilityConfig
from .entries import MemoryEntry, MemoryStoreError, MetaPlanPair, RecordTooLarge

logger = logging.getLogger(__name__)

JOURNAL_NAME = "memory.journal"
SNAPSHOT_NAME = "memory.snapshot"
_HEADER = struct.Struct("<II")  # payload length, crc32
_SNAPSHOT_FORMAT = 2
"""1: one frame holding a ``Snapshot`` (read, no longer written); 2: a ``SnapshotHead`` frame, then parts."""
SNAPSHOT_PART_RECORDS = 4096
"""Memories (or Meta Plan pairs) per snapshot part: with text fields capped (``memory.text_limits``), a
part stays tens of MB at most, far under a frame's 4 GiB."""
_FILE_MODE = 0o600
CORRUPT_SUFFIX = ".corrupt-"
MAX_FRAME_BYTES = 2**32 - 1
"""What a frame's u32 length field can say."""
_CHANGE_KEY = msgspec.msgpack.encode("seq")  # a Change payload opens with a fixmap, then this key


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


class SnapshotHead(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The first frame of a format-2 snapshot: the store's scalars and how many records its parts hold."""

    format: int
    seq: int
    dim: int
    num_entries: int
    num_meta_plans: int
    last_clear_at: float | None = None


class SnapshotPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One frame of records after the head."""

    entries: list[MemoryEntry] = []
    meta_plans: list[MetaPlanPair] = []


class _FormatOnly(msgspec.Struct):
    format: int = 1


class Recovered(msgspec.Struct, frozen=True):
    """What ``Journal.open`` found on disk: the snapshot (if any) and the changes to replay after it."""

    snapshot: Snapshot | None
    changes: list[Change]
    num_damaged_bytes: int = 0
    """Bytes skipped before the last valid frame (copied aside): the journal should be compacted."""


class _Scan(NamedTuple):
    """The valid frames of a journal, the damaged runs between them, and where the valid part ends."""

    changes: list[Change]
    skipped: list[tuple[int, int]]
    """(offset, size) of each damaged run followed by a valid frame."""
    end: int
    """End of the last valid frame; bytes after it are a torn or corrupt tail."""


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
            snapshot = _read_snapshot(data_dir / SNAPSHOT_NAME)
            scan = _scan_journal(path.read_bytes() if path.exists() else b"")
            for offset, size in scan.skipped:
                _set_aside(path, offset, size, "damaged run", len(scan.changes))
            if os.fstat(fd).st_size != scan.end:
                _set_aside(path, scan.end, os.fstat(fd).st_size - scan.end, "torn or corrupt tail", len(scan.changes))
                os.ftruncate(fd, scan.end)
                os.fsync(fd)
            fsync_dir(data_dir)
        except BaseException:
            os.close(fd)
            raise
        floor = snapshot.seq if snapshot is not None else 0
        changes = [c for c in scan.changes if c.seq > floor]
        num_damaged = sum(size for _, size in scan.skipped)
        return cls(data_dir, config, fd, scan.end), Recovered(snapshot, changes, num_damaged)

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
        write_file_atomic(self._data_dir / SNAPSHOT_NAME, self._snapshot_frames(snapshot), mode=_FILE_MODE)
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self._size = 0

    def _snapshot_frames(self, snapshot: Snapshot) -> Iterator[bytes]:
        encode, step = self._encoder.encode, SNAPSHOT_PART_RECORDS
        yield _frame(encode(SnapshotHead(_SNAPSHOT_FORMAT, snapshot.seq, snapshot.dim, len(snapshot.entries),
                                         len(snapshot.meta_plans), snapshot.last_clear_at)))
        for start in range(0, len(snapshot.entries), step):
            yield _frame(encode(SnapshotPart(entries=snapshot.entries[start : start + step])))
        for start in range(0, len(snapshot.meta_plans), step):
            yield _frame(encode(SnapshotPart(meta_plans=snapshot.meta_plans[start : start + step])))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise RecordTooLarge(f"a journal or snapshot frame holds at most {MAX_FRAME_BYTES} bytes, this one "
                             f"would take {len(payload)}")
    return _HEADER.pack(len(payload), _crc(struct.pack("<I", len(payload)), payload)) + payload


def _crc(length_field: bytes, payload: bytes) -> int:
    """A frame's CRC: crc32 over its 4-byte length field, then its payload."""
    return zlib.crc32(payload, zlib.crc32(length_field))


def _payload_at(data: bytes, offset: int) -> bytes | None:
    """The payload of the frame at ``offset`` if it fits ``data`` and passes its CRC, else None.

    No length cap: the data is already in memory, and the CRC covers the length field too."""
    if len(data) - offset < _HEADER.size:
        return None
    length, crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if length > len(data) - start:
        return None
    payload = data[start : start + length]
    return payload if _crc(data[offset : offset + 4], payload) == crc else None


def _change_at(data: bytes, offset: int, decoder: msgspec.msgpack.Decoder[Change]) -> tuple[Change, int] | None:
    """The change in the frame at ``offset`` and the frame's end, or None if the frame is not valid."""
    payload = _payload_at(data, offset)
    if payload is None:
        return None
    try:
        return decoder.decode(payload), offset + _HEADER.size + len(payload)
    except msgspec.DecodeError:  # CRC fine but not a Change: damage like any other
        return None


def _next_frame(data: bytes, start: int, after_seq: int,
                decoder: msgspec.msgpack.Decoder[Change]) -> tuple[int, Change, int] | None:
    """The first offset at or after ``start`` holding a frame that passes its CRC, decodes as a ``Change``
    and has ``seq > after_seq`` (a frame found by scanning needs more evidence than one found in place).

    Only offsets whose payload opens like a ``Change`` (a msgpack map whose first key is "seq") are
    checked, so a scan through megabytes of damage costs one ``find`` per candidate, not a CRC per byte."""
    position = start + _HEADER.size + 1
    while (hit := data.find(_CHANGE_KEY, position)) >= 0:
        offset = hit - _HEADER.size - 1
        position = hit + 1
        if data[hit - 1] & 0xF0 != 0x80:  # a fixmap: Change has fewer than 16 fields
            continue
        found = _change_at(data, offset, decoder)
        if found is not None and found[0].seq > after_seq:
            return offset, *found
    return None


def _scan_journal(data: bytes) -> _Scan:
    """Every valid frame of ``data``: in place while they chain, by resynchronising after damage."""
    decoder = msgspec.msgpack.Decoder(Change)
    changes: list[Change] = []
    skipped: list[tuple[int, int]] = []
    offset = 0
    while offset < len(data):
        found = _change_at(data, offset, decoder)
        if found is None:
            resync = _next_frame(data, offset + 1, changes[-1].seq if changes else 0, decoder)
            if resync is None:
                break  # nothing valid follows: a torn or corrupt tail
            skipped.append((offset, resync[0] - offset))
            found = resync[1:]
        changes.append(found[0])
        offset = found[1]
    return _Scan(changes, skipped, offset)


def _set_aside(path: Path, offset: int, size: int, what: str, num_kept: int) -> Path:
    """Copy ``size`` bytes at ``offset`` to a private side file (durably) before the journal loses them."""
    aside = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{time.time_ns()}-at-{offset}")
    with open(path, "rb") as source, open(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE),
                                          "wb") as target:
        source.seek(offset)
        remaining = size
        while remaining and (chunk := source.read(min(remaining, 1 << 20))):
            target.write(chunk)
            remaining -= len(chunk)
        target.flush()
        os.fsync(target.fileno())
    fsync_dir(path.parent)
    logger.warning("memory journal %s: a %s of %d bytes at offset %d was copied aside to %s; kept %d valid records",
                   path, what, size, offset, aside.name, num_kept)
    return aside


def _read_snapshot(path: Path) -> Snapshot | None:
    """The snapshot at ``path`` (None: there is none), in either format; ``CorruptSnapshot`` on any damage."""
    if not path.exists():
        return None
    with open(path, "rb") as file:
        frames = _snapshot_payloads(file, path)
        first = next(frames, None)
        if first is None:
            raise CorruptSnapshot(f"memory snapshot {path} is empty")
        try:
            form = msgspec.msgpack.decode(first, type=_FormatOnly).format
            if form == 1:
                if next(frames, None) is not None:
                    raise CorruptSnapshot(f"memory snapshot {path} has data after its one frame")
                return msgspec.msgpack.decode(first, type=Snapshot)
            if form != _SNAPSHOT_FORMAT:
                raise CorruptSnapshot(f"memory snapshot {path} has format {form}, expected {_SNAPSHOT_FORMAT}")
            head = msgspec.msgpack.decode(first, type=SnapshotHead)
            decoder = msgspec.msgpack.Decoder(SnapshotPart)
            entries: list[MemoryEntry] = []
            meta_plans: list[MetaPlanPair] = []
            for payload in frames:
                part = decoder.decode(payload)
                entries += part.entries
                meta_plans += part.meta_plans
        except msgspec.DecodeError as err:
            raise CorruptSnapshot(f"memory snapshot {path} cannot be decoded: {err}") from None
    if (len(entries), len(meta_plans)) != (head.num_entries, head.num_meta_plans):
        raise CorruptSnapshot(f"memory snapshot {path} holds {len(entries)} memories and {len(meta_plans)} Meta "
                              f"Plan pairs; its head says {head.num_entries} and {head.num_meta_plans}")
    return Snapshot(head.seq, head.dim, entries, meta_plans, head.last_clear_at)


def _snapshot_payloads(file: BinaryIO, path: Path) -> Iterator[bytes]:
    """Each frame's payload in turn, read as it comes (a snapshot can be larger than memory twice over)."""
    while header := file.read(_HEADER.size):
        if len(header) < _HEADER.size:
            raise CorruptSnapshot(f"memory snapshot {path} ends inside a frame header")
        length, crc = _HEADER.unpack(header)
        payload = file.read(length)
        if len(payload) != length or _crc(header[:4], payload) != crc:
            raise CorruptSnapshot(f"memory snapshot {path} fails its length/CRC check")
        yield payload


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
    """The memory folder made private, or an existing one checked, as every folder the server writes
    (``base/files.py: private_dir``); a new one's entry in its parent is made durable."""
    existed = os.path.lexists(path)
    private_dir(path, "server.data_dir")
    if not existed:
        fsync_dir(path.parent)
