"""Crash safety of the store: an append-only journal of changes, in segments, plus snapshot generations.

On disk, under the data dir (files 0600, the folder 0700: memories can hold anything a user asked; every
rename and creation is followed by an fsync of the folder):
- ``memory.lock``: locked (``flock``) by the process that has the store open; another gets ``StoreInUse``.
- ``memory.journal``: the active journal segment: a header line, then frames (``framing.py``), each payload
  one msgpack ``Change`` whose ``seq`` is one above the last. A write is acknowledged after its frame is
  written (and fsynced, by default), so an acknowledged change survives ``kill -9``. A change larger than
  ``max_record_bytes`` is refused before it is written; replay accepts a frame of any size that passes its
  CRC, so lowering the limit never drops an older record.
- ``memory.journal.<seq>``: a sealed segment: the active one as it was when a snapshot at ``seq`` was taken,
  so it holds the changes after the previous seal up to ``seq``.
- ``memory.snapshot.<seq>``: a snapshot generation, the whole store at ``seq`` in parts that each pass or
  fail on their own (``snapshot.py``).

The generation protocol. Taking a snapshot seals the active segment (on the store's thread, between two
writes); the snapshot is then written on a thread of its own: a temp file, fsynced, renamed, the folder
fsynced. Only then are the generations older than the previous one removed, with the sealed segments that
hold nothing after the previous generation. So the newest durable generation and the one before it are on
disk at every moment, each with every journal record written after it, whatever step a crash interrupts:
a start (``recovery.py``) takes the newest generation that reads whole; when it does not, the previous one
plus the journal since, if they cover it (or the journal alone, while it still holds every change); else
what the newest holds, less its damaged parts. It never refuses to start because of a snapshot, and logs
what was lost.

Replay resynchronises past damage: a run of bytes that is not a valid frame, or a frame whose ``seq`` is not
above the last one kept (a stray copy), is skipped, and every valid frame after it is kept. Each skipped run
is copied to ``<segment>.corrupt-<unix time ns>-at-<offset>`` (never deleted) and logged with its offset and
size; the store then compacts, so the next start is clean. Damage with no valid frame after it in the active
segment (a torn tail: a crash mid write) is copied aside the same way and cut. Files of the previous format
(``memory.journal`` without a header, ``memory.snapshot``) are still read: ``legacy.py``.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import NamedTuple

import msgspec

from ..base.files import fsync_dir, private_dir
from ..config.memory import DurabilityConfig
from .entries import MemoryEntry, MemoryStoreError, MetaPlanPair, RecordTooLarge
from .framing import FILE_MODE, frame, frames, write_all

JOURNAL_NAME = "memory.journal"
SNAPSHOT_NAME = "memory.snapshot"
"""The snapshot of the previous format; generations are ``memory.snapshot.<seq>``."""
LOCK_NAME = "memory.lock"
JOURNAL_HEADER = b"MIA memory journal 3\n"
NEW_SEGMENT_NAME = JOURNAL_NAME + ".new"
_SEALED = re.compile(r"^memory\.journal\.(\d+)$")


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
    """The whole store as of change ``seq``: lists of frozen records, so a later write never changes it."""

    seq: int
    dim: int
    entries: list[MemoryEntry]
    meta_plans: list[MetaPlanPair]
    last_clear_at: float | None = None


class SegmentScan(NamedTuple):
    """The valid frames of a journal segment, the damaged runs between them, and where the valid part ends."""

    changes: list[Change]
    skipped: list[tuple[int, int]]
    """(offset, size) of each damaged run followed by a valid frame."""
    end: int
    """End of the last valid frame (or of the header); bytes after it are a torn or corrupt tail."""


def scan_segment(data: bytes, start: int) -> SegmentScan:
    """Every valid frame of ``data`` after ``start`` (the header's end), each with a ``seq`` above the last."""
    decoder = msgspec.msgpack.Decoder(Change)
    changes: list[Change] = []
    skipped: list[tuple[int, int]] = []
    end = start
    for offset, frame_end, payload in frames(data, start):
        change = _decoded(payload, decoder)
        if change is None or (changes and change.seq <= changes[-1].seq):
            continue
        if offset > end:
            skipped.append((end, offset - end))
        changes.append(change)
        end = frame_end
    return SegmentScan(changes, skipped, end)


def _decoded(payload: bytes | None, decoder: msgspec.msgpack.Decoder[Change]) -> Change | None:
    if payload is None:
        return None
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError:  # CRC fine but not a Change: damage like any other
        return None


def sealed_segments(data_dir: Path) -> list[tuple[int, Path]]:
    """(seq, path) of each sealed segment, oldest first."""
    found = [(int(m.group(1)), path) for path in data_dir.iterdir() if (m := _SEALED.match(path.name))]
    return sorted(found)


def segment_path(data_dir: Path, seq: int) -> Path:
    return data_dir / f"{JOURNAL_NAME}.{seq}"


class Journal:
    """The active segment, appended to by the store's thread (not thread-safe), and the data dir's lock."""

    def __init__(self, data_dir: Path, config: DurabilityConfig, lock_fd: int, fd: int, size: int) -> None:
        self._data_dir = data_dir
        self._config = config
        self._lock_fd = lock_fd
        self._fd = fd
        self._size = size
        self._last_start = size
        """Where the frame ``append`` wrote last starts: ``retract`` cuts back to it."""
        self._encoder = msgspec.msgpack.Encoder()

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
        data = frame(payload)
        try:
            write_all(self._fd, data)
            if self._config.fsync == "always":
                os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise
        self._last_start, self._size = self._size, self._size + len(data)

    def retract(self) -> None:
        """Cut the frame ``append`` wrote last: its change failed to apply and was never acknowledged, so it
        must not replay (and its ``seq`` is free again)."""
        os.ftruncate(self._fd, self._last_start)
        os.fsync(self._fd)
        self._size = self._last_start

    def seal(self, seq: int) -> Path | None:
        """Rename the active segment ``memory.journal.<seq>`` (``seq``: its last change's) and start a new
        one; None when it holds no change. Every write after this goes to the new segment."""
        if self._size <= len(JOURNAL_HEADER):
            return None
        active, sealed = self._data_dir / JOURNAL_NAME, segment_path(self._data_dir, seq)
        if sealed.exists():
            raise FileExistsError(f"{sealed} exists: a segment is sealed once per snapshot seq")
        new_fd = new_segment(self._data_dir / NEW_SEGMENT_NAME)
        try:
            os.rename(active, sealed)
            try:
                os.rename(self._data_dir / NEW_SEGMENT_NAME, active)
            except OSError:
                os.rename(sealed, active)
                raise
        except OSError:
            os.close(new_fd)
            (self._data_dir / NEW_SEGMENT_NAME).unlink(missing_ok=True)
            raise
        os.close(self._fd)
        self._fd, self._size = new_fd, len(JOURNAL_HEADER)
        self._last_start = self._size
        fsync_dir(self._data_dir)  # before any write goes to the new segment: its name must survive
        return sealed

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1


def new_segment(path: Path) -> int:
    """A new, empty segment at ``path`` (header written and fsynced, locked): its fd, open for appending."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        lock(fd, path)
        write_all(fd, JOURNAL_HEADER)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock(fd: int, path: Path) -> None:
    """Exclusive advisory lock for the life of the fd; the kernel drops it when a process dies (kill -9).

    The data dir's lock is ``memory.lock``; the active segment is locked too, as earlier versions locked
    ``memory.journal``, so one of those cannot open a data dir this version has open."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StoreInUse(f"{path} is open in another process") from None


def lock_data_dir(data_dir: Path) -> int:
    """The data dir made private (or checked) and locked: the fd of ``memory.lock``, to close when done."""
    existed = os.path.lexists(data_dir)
    private_dir(data_dir, "server.data_dir")  # as every folder the server writes (base/files.py)
    if not existed:
        fsync_dir(data_dir.parent)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        lock(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd
