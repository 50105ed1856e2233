"""Snapshot generations: the whole store at one ``seq``, written off the store's thread and read part by part.

``memory.snapshot.<seq>``: a header line, then frames (``framing.py``), each one ``SnapshotPart``: up to
``SNAPSHOT_PART_RECORDS`` memories or Meta Plan pairs and, repeated in every part, the store's scalars, the
part's index and the totals, so any one part that reads says what the generation should hold. A part that
fails its check loses only its own records (``read_generation`` says which parts and how many records).

``SnapshotWriter`` writes a generation (temp file, fsync, rename, fsync of the folder) on a thread of its
own, from a ``Snapshot`` the store's thread took (lists of frozen records, which no later write changes), so
no write or search waits for the encoding or the fsync; then ``retire`` removes what two durable generations
make redundant. The protocol as a whole is described in ``journal.py``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path
from typing import NamedTuple

import msgspec

from ..base.files import fsync_dir, write_file_atomic
from .entries import MemoryEntry, MetaPlanPair
from .framing import FILE_MODE, frame, read_frames
from .journal import SNAPSHOT_NAME, Snapshot, sealed_segments

logger = logging.getLogger(__name__)

SNAPSHOT_HEADER = b"MIA memory snapshot 3\n"
SNAPSHOT_PART_RECORDS = 4096
"""Memories (or Meta Plan pairs) per part: with text fields capped (``memory.text_limits``) a part stays tens
of MB at most, and a damaged one loses no more than this many records."""
_GENERATION = re.compile(r"^memory\.snapshot\.(\d+)$")
LEGACY_SEQ = -1
"""Where ``memory.snapshot`` (the previous format) sorts among generations: before every current one, which
were all written after it."""


class SnapshotPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One frame of a generation: its records and, in every part, what the whole generation holds."""

    seq: int
    dim: int
    index: int
    num_parts: int
    num_entries: int
    num_meta_plans: int
    last_clear_at: float | None = None
    entries: list[MemoryEntry] = []
    meta_plans: list[MetaPlanPair] = []


class LoadedGeneration(NamedTuple):
    """What ``read_generation`` found in one generation file."""

    path: Path
    snapshot: Snapshot | None
    """What could be read; None when no part could (then nothing is known of the generation)."""
    damaged: list[tuple[int, int]]
    """(offset, size) of each run of bytes that failed its check."""
    missing_parts: list[int]
    """Indexes of the parts that were not read."""
    num_lost_entries: int = 0
    num_lost_meta_plans: int = 0

    @property
    def is_whole(self) -> bool:
        return (self.snapshot is not None and not self.damaged and not self.missing_parts
                and self.num_lost_entries == self.num_lost_meta_plans == 0)


def generation_path(data_dir: Path, seq: int) -> Path:
    return data_dir / f"{SNAPSHOT_NAME}.{seq}"


def generations(data_dir: Path) -> list[tuple[int, Path]]:
    """(seq, path) of each generation file, oldest first (``memory.snapshot`` of the previous format first)."""
    found = [(int(m.group(1)), path) for path in data_dir.iterdir() if (m := _GENERATION.match(path.name))]
    legacy = data_dir / SNAPSHOT_NAME
    return ([(LEGACY_SEQ, legacy)] if legacy.is_file() else []) + sorted(found)


def write_generation(data_dir: Path, snapshot: Snapshot) -> Path:
    """Write ``snapshot`` as generation ``seq``, durably (its temp file, ``<name>.tmp``, is removed by the next
    open if a crash left it)."""
    path = generation_path(data_dir, snapshot.seq)
    write_file_atomic(path, _frames(snapshot), tmp=path.with_name(path.name + ".tmp"), mode=FILE_MODE)
    return path


def _frames(snapshot: Snapshot) -> Iterator[bytes]:
    step, encode = SNAPSHOT_PART_RECORDS, msgspec.msgpack.Encoder().encode
    chunks = [(snapshot.entries[i:i + step], []) for i in range(0, len(snapshot.entries), step)]
    chunks += [([], snapshot.meta_plans[i:i + step]) for i in range(0, len(snapshot.meta_plans), step)]
    chunks = chunks or [([], [])]  # an empty store still has a part: it says the seq
    yield SNAPSHOT_HEADER
    for index, (entries, meta_plans) in enumerate(chunks):
        yield frame(encode(SnapshotPart(snapshot.seq, snapshot.dim, index, len(chunks), len(snapshot.entries),
                                        len(snapshot.meta_plans), snapshot.last_clear_at, entries, meta_plans)))


def read_generation(path: Path) -> LoadedGeneration:
    """Every part of the generation at ``path`` that passes its check; the damaged runs and missing parts."""
    decoder = msgspec.msgpack.Decoder(SnapshotPart)
    parts: dict[int, SnapshotPart] = {}
    damaged: list[tuple[int, int]] = []
    with open(path, "rb") as file:
        start = len(SNAPSHOT_HEADER) if file.read(len(SNAPSHOT_HEADER)) == SNAPSHOT_HEADER else 0
        for offset, end, payload in read_frames(file, start):
            part = _part(payload, decoder)
            first = next(iter(parts.values()), part)
            if part is None or part.index in parts or not _same_generation(part, first):
                _add_run(damaged, offset, end - offset)
            else:
                parts[part.index] = part
    if not parts:
        return LoadedGeneration(path, None, damaged, [])
    return _assembled(path, parts, damaged)


def _part(payload: bytes | None, decoder: msgspec.msgpack.Decoder[SnapshotPart]) -> SnapshotPart | None:
    if payload is None:
        return None
    try:
        part = decoder.decode(payload)
    except msgspec.DecodeError:
        return None
    return part if 0 <= part.index < part.num_parts else None


def _same_generation(part: SnapshotPart, first: SnapshotPart) -> bool:
    fields = ("seq", "dim", "num_parts", "num_entries", "num_meta_plans", "last_clear_at")
    return all(getattr(part, name) == getattr(first, name) for name in fields)


def _add_run(runs: list[tuple[int, int]], offset: int, size: int) -> None:
    """Record a damaged run, merged with the previous one when they touch."""
    if runs and sum(runs[-1]) == offset:
        runs[-1] = (runs[-1][0], runs[-1][1] + size)
    else:
        runs.append((offset, size))


def _assembled(path: Path, parts: dict[int, SnapshotPart], damaged: list[tuple[int, int]]) -> LoadedGeneration:
    first = next(iter(parts.values()))
    entries = [entry for index in sorted(parts) for entry in parts[index].entries]
    meta_plans = [pair for index in sorted(parts) for pair in parts[index].meta_plans]
    snapshot = Snapshot(first.seq, first.dim, entries, meta_plans, first.last_clear_at)
    missing = [index for index in range(first.num_parts) if index not in parts]
    return LoadedGeneration(path, snapshot, damaged, missing, first.num_entries - len(entries),
                            first.num_meta_plans - len(meta_plans))


def retire(data_dir: Path, damaged: Collection[Path] = ()) -> None:
    """Once a new generation is durable: remove ``damaged`` generation files (what they held has been read and
    their damaged bytes copied aside), every generation older than the previous one, and the sealed journal
    segments that hold no change after the previous generation. Failures are logged: nothing needs them."""
    newest = generations(data_dir)[-1][1]
    _remove([path for path in damaged if path != newest])  # the newest may have replaced a damaged one
    kept = generations(data_dir)
    if len(kept) < 2:
        return
    floor = kept[-2][0]  # the previous generation: what it and the newest both cover is redundant
    _remove([path for _, path in kept[:-2]] + [path for seq, path in sealed_segments(data_dir) if seq <= floor])


def _remove(paths: list[Path]) -> None:
    try:
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            fsync_dir(paths[0].parent)
    except OSError as err:
        logger.warning("memory snapshot: could not remove a file no longer needed (%s); the next snapshot tries "
                       "again", err)


class SnapshotWriter:
    """Writes generations one at a time: on a thread of its own (``start``) or on the caller's (``write``)."""

    def __init__(self, data_dir: Path, durable_seq: int) -> None:
        self._data_dir = data_dir
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-snapshot")
        self._pending: Future[Path] | None = None
        self.durable_seq = durable_seq
        """``seq`` of the newest durable generation (at open: of the one loaded, 0 for none)."""

    @property
    def is_busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def start(self, snapshot: Snapshot) -> None:
        """Write ``snapshot`` in the background; one at a time (check ``is_busy`` first)."""
        if self.is_busy:
            raise RuntimeError("a snapshot is being written already")
        self._pending = self._executor.submit(self.write, snapshot)

    def finished(self) -> Future[Path] | None:
        """The background write once it has finished (returned once), else None."""
        if self._pending is None or not self._pending.done():
            return None
        done, self._pending = self._pending, None
        return done

    def write(self, snapshot: Snapshot, damaged: Collection[Path] = ()) -> Path:
        """Write ``snapshot`` as the newest generation on this thread, then ``retire``."""
        path = write_generation(self._data_dir, snapshot)
        self.durable_seq = snapshot.seq
        retire(self._data_dir, damaged)
        return path

    def wait(self) -> None:
        """Until the background write (if any) has finished."""
        if self._pending is not None:
            wait_for([self._pending])

    def close(self) -> None:
        self.wait()
        self._executor.shutdown()


def remove_temps(data_dir: Path) -> None:
    """Generations a crash left half written (never renamed into place)."""
    for path in data_dir.glob(SNAPSHOT_NAME + "*.tmp"):
        os.unlink(path)
