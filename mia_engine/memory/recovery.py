"""Opening the store's files: lock the data dir, repair the active journal segment, pick the snapshot generation
to load and the journal records to replay after it (``journal.py`` describes the files and the protocol).

The choice: the newest generation that reads whole; else an older one that does, when the journal records after
it cover every change up to the newest one's ``seq`` (nothing is lost); else the newest that reads in part, less
its damaged parts; else none (the journal alone). Damaged bytes are copied aside, never deleted, and the log
says what each generation lost and which one was loaded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from ..base.files import fsync_dir
from ..config.memory import DurabilityConfig
from .framing import FILE_MODE, copy_aside, write_all
from .journal import (
    JOURNAL_HEADER,
    JOURNAL_NAME,
    NEW_SEGMENT_NAME,
    SNAPSHOT_NAME,
    Change,
    Journal,
    SegmentScan,
    Snapshot,
    lock,
    lock_data_dir,
    new_segment,
    scan_segment,
    sealed_segments,
    segment_path,
)
from .legacy import read_legacy_snapshot, scan_legacy_journal
from .snapshot import LEGACY_SEQ, LoadedGeneration, generations, read_generation, remove_temps

logger = logging.getLogger(__name__)


class Recovered(NamedTuple):
    """What ``recover`` found on disk: the snapshot to restore (if any) and the changes to replay after it."""

    snapshot: Snapshot | None
    changes: list[Change]
    num_damaged_bytes: int = 0
    """Journal bytes skipped before valid frames (copied aside): the store should compact."""
    damaged_generations: list[Path] = []
    """Generation files that did not read whole (what could be read was; the rest was copied aside): the store
    should compact, and they are removed once a new generation is durable."""

    @property
    def floor(self) -> int:
        return self.snapshot.seq if self.snapshot is not None else 0


def recover(data_dir: Path, config: DurabilityConfig) -> tuple[Journal, Recovered]:
    """Lock ``data_dir``, repair and open its active segment for appending, and read what to restore."""
    lock_fd = lock_data_dir(data_dir)
    fd = -1
    try:
        remove_temps(data_dir)
        (data_dir / NEW_SEGMENT_NAME).unlink(missing_ok=True)  # a seal a crash interrupted
        fd, active, sealed_now = _open_active(data_dir)
        sealed = _SealedSegments(data_dir, sealed_now)
        loaded, changes, damaged = _choose(data_dir, sealed, active.changes)
    except BaseException:
        for open_fd in (fd, lock_fd):
            if open_fd >= 0:
                os.close(open_fd)
        raise
    snapshot = loaded.snapshot if loaded is not None else None
    num_damaged = sealed.num_damaged_bytes + sum(size for _, size in active.skipped)
    recovered = Recovered(snapshot, changes, num_damaged, [gen.path for gen in damaged])
    return Journal(data_dir, config, lock_fd, fd, active.end), recovered


def _open_active(data_dir: Path) -> tuple[int, SegmentScan, dict[Path, SegmentScan]]:
    """The active segment, locked, repaired (damaged runs copied aside, a torn tail cut) and open for
    appending: (fd, its scan, {}). One of the previous format is sealed and a new one started: then the
    scan is the new one's and the dict holds the sealed one's."""
    path = data_dir / JOURNAL_NAME
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        lock(fd, path)
        os.fchmod(fd, FILE_MODE)  # journals written by older versions were 0644
        data = path.read_bytes()
        scan, is_legacy = _scan_any(data)
        _set_aside_damage(path, scan, len(data), is_active=True)
        if scan.end != len(data):
            os.ftruncate(fd, scan.end)
            os.fsync(fd)
        if is_legacy and scan.changes:
            return _seal_legacy(data_dir, fd, scan)
        if scan.end == 0:
            write_all(fd, JOURNAL_HEADER)
            os.fsync(fd)
            scan = scan._replace(end=len(JOURNAL_HEADER))
    except BaseException:
        os.close(fd)
        raise
    return fd, scan, {}


def _scan_any(data: bytes) -> tuple[SegmentScan, bool]:
    """A segment's scan and whether it is of the previous format (no header line). Without a header, both
    readings are tried and the one that finds more changes wins: the header itself may be what is damaged."""
    if data.startswith(JOURNAL_HEADER) or not data:
        return scan_segment(data, len(JOURNAL_HEADER) if data else 0), False
    current, legacy = scan_segment(data, 0), scan_legacy_journal(data)
    return (legacy, True) if len(legacy.changes) >= len(current.changes) else (current, False)


def _seal_legacy(data_dir: Path, fd: int, scan: SegmentScan) -> tuple[int, SegmentScan, dict[Path, SegmentScan]]:
    """Seal a journal of the previous format as a segment (never appended to again) and start a new one."""
    sealed = segment_path(data_dir, max(change.seq for change in scan.changes))
    new_fd = new_segment(data_dir / NEW_SEGMENT_NAME)
    try:
        os.rename(data_dir / JOURNAL_NAME, sealed)
        os.rename(data_dir / NEW_SEGMENT_NAME, data_dir / JOURNAL_NAME)
        fsync_dir(data_dir)
    except BaseException:
        os.close(new_fd)
        raise
    os.close(fd)
    logger.info("memory journal: %d records of the previous format sealed as %s", len(scan.changes), sealed.name)
    return new_fd, SegmentScan([], [], len(JOURNAL_HEADER)), {sealed: scan}


class _SealedSegments:
    """The sealed segments, each read (and its damage copied aside) the first time a choice needs it."""

    def __init__(self, data_dir: Path, scanned: dict[Path, SegmentScan]) -> None:
        self._segments = sealed_segments(data_dir)
        self._scans = dict(scanned)
        self.num_damaged_bytes = sum(size for scan in scanned.values() for _, size in scan.skipped)

    def changes_after(self, floor: int) -> list[Change]:
        """The changes with ``seq > floor`` of the segments that can hold any, oldest first."""
        return [change for seq, path in self._segments if seq > floor
                for change in self._scan(path).changes if change.seq > floor]

    def _scan(self, path: Path) -> SegmentScan:
        if path not in self._scans:
            data = path.read_bytes()
            scan, _ = _scan_any(data)
            _set_aside_damage(path, scan, len(data), is_active=False)
            self.num_damaged_bytes += sum(size for _, size in scan.skipped) + len(data) - scan.end
            self._scans[path] = scan
        return self._scans[path]


def _set_aside_damage(path: Path, scan: SegmentScan, size: int, *, is_active: bool) -> None:
    """Copy each damaged run of a segment aside, and its tail past the last valid frame."""
    for offset, run in scan.skipped:
        _log_aside(path, offset, run, "damaged run", len(scan.changes))
    if scan.end != size:
        _log_aside(path, scan.end, size - scan.end, "torn or corrupt tail" if is_active else "corrupt tail",
                   len(scan.changes))


def _log_aside(path: Path, offset: int, size: int, what: str, num_kept: int) -> None:
    aside = copy_aside(path, offset, size)
    logger.warning("memory journal %s: a %s of %d bytes at offset %d was copied aside to %s; kept %d valid records",
                   path, what, size, offset, aside.name, num_kept)


def _choose(data_dir: Path, sealed: _SealedSegments,
            active: list[Change]) -> tuple[LoadedGeneration | None, list[Change], list[LoadedGeneration]]:
    """(the generation to load, the changes to replay after it, the generations that did not read whole)."""
    def journal_after(floor: int) -> list[Change]:
        return sealed.changes_after(floor) + [change for change in active if change.seq > floor]

    damaged: list[LoadedGeneration] = []
    listed = generations(data_dir)[::-1]
    newest_seq = listed[0][0] if listed and listed[0][0] != LEGACY_SEQ else None
    for _, path in listed:
        gen = _read(path)
        if not damaged and newest_seq is None and gen.snapshot is not None:
            newest_seq = gen.snapshot.seq  # the previous format's snapshot, the only generation
        if not gen.is_whole:
            _report_damage(gen)
            damaged.append(gen)
            continue
        changes = journal_after(gen.snapshot.seq)
        if not damaged or newest_seq is None or _covers(changes, gen.snapshot.seq, newest_seq):
            if damaged:
                logger.warning("memory snapshot: loaded the previous generation %s (seq %d) and the %d journal "
                               "records after it, which cover the damaged newer one: nothing was lost", gen.path.name,
                               gen.snapshot.seq, len(changes))
            return gen, changes, damaged
        break
    else:  # no generation reads whole: the journal alone, when it still holds every change from the first
        changes = journal_after(0)
        if damaged and newest_seq is not None and _covers(changes, 0, newest_seq):
            logger.warning("memory snapshot: rebuilt from the %d journal records on disk, which cover the damaged "
                           "generations: nothing was lost", len(changes))
            return None, changes, damaged
    partial = next((gen for gen in damaged if gen.snapshot is not None), None)
    _report_choice(partial, damaged)
    return partial, journal_after(partial.snapshot.seq if partial is not None else 0), damaged


def _covers(changes: list[Change], floor: int, target: int) -> bool:
    """Whether ``changes`` hold every change after ``floor`` up to ``target``."""
    return set(range(floor + 1, target + 1)) <= {change.seq for change in changes}


def _read(path: Path) -> LoadedGeneration:
    try:
        return read_legacy_snapshot(path) if path.name == SNAPSHOT_NAME else read_generation(path)
    except OSError as err:
        logger.error("memory snapshot %s cannot be read: %s", path, err)
        return LoadedGeneration(path, None, [], [])


def _report_damage(gen: LoadedGeneration) -> None:
    """Copy a generation's damaged runs aside and say what they held."""
    for offset, size in gen.damaged:
        aside = copy_aside(gen.path, offset, size)
        logger.warning("memory snapshot %s: a damaged run of %d bytes at offset %d was copied aside to %s",
                       gen.path, size, offset, aside.name)
    if gen.snapshot is None:
        logger.error("memory snapshot %s: no part of it can be read", gen.path)
        return
    logger.error("memory snapshot %s: parts %s cannot be read: %d memories and %d Meta Plan pairs are in them",
                 gen.path, gen.missing_parts or "after the damage", gen.num_lost_entries, gen.num_lost_meta_plans)


def _report_choice(partial: LoadedGeneration | None, damaged: list[LoadedGeneration]) -> None:
    """Say what the store lost when no generation (or none with the journal since) reads whole."""
    if partial is not None:
        snapshot = partial.snapshot
        logger.error("memory snapshot: loaded what %s holds intact (%d memories, %d Meta Plan pairs) and the journal "
                     "after it; lost %d memories and %d Meta Plan pairs that only its damaged parts held",
                     partial.path.name, len(snapshot.entries), len(snapshot.meta_plans), partial.num_lost_entries,
                     partial.num_lost_meta_plans)
    elif damaged:
        logger.error("memory snapshot: no generation can be read (%s); the store holds only what the journal "
                     "segments on disk hold", ", ".join(gen.path.name for gen in damaged))
