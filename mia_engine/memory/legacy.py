"""Reading the files of the previous on-disk format, so a data dir written by an earlier version still opens.

- ``memory.journal`` without a header line: frames ``<u32 length><u32 crc32(length ‖ payload)><payload>``,
  each payload one msgpack ``Change``. Replay resynchronises past damage onto the next frame that passes its
  CRC, decodes as a ``Change`` and carries a later ``seq``.
- ``memory.snapshot``: frames of the same kind: one holding a whole ``Snapshot`` (format 1), or a head (format
  2: the store's scalars and its counts) then parts of records. These frames cannot be found again after
  damage, so a damaged frame loses the records of every part after it (the log says how many).

Neither is written any more: the first start seals such a journal as a segment, and the snapshots taken
after it are generations of the current format (``journal.py``), which retire these files in their turn.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from .entries import MemoryEntry, MetaPlanPair
from .journal import Change, SegmentScan, Snapshot
from .snapshot import LoadedGeneration

_HEADER = struct.Struct("<II")  # payload length, crc32
_CHANGE_KEY = msgspec.msgpack.encode("seq")  # a Change payload opens with a fixmap, then this key


class _SnapshotV1(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    seq: int
    dim: int
    entries: list[MemoryEntry]
    meta_plans: list[MetaPlanPair]
    last_clear_at: float | None = None
    format: int = 1


class _HeadV2(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    seq: int
    dim: int
    num_entries: int
    num_meta_plans: int
    last_clear_at: float | None = None


class _PartV2(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    entries: list[MemoryEntry] = []
    meta_plans: list[MetaPlanPair] = []


class _FormatOnly(msgspec.Struct):
    format: int = 1


def legacy_frame(payload: bytes) -> bytes:
    """A frame of the previous format (tests write old data dirs with it)."""
    return _HEADER.pack(len(payload), _crc(struct.pack("<I", len(payload)), payload)) + payload


def _crc(length_field: bytes, payload: bytes) -> int:
    """A frame's CRC: crc32 over its 4-byte length field, then its payload."""
    return zlib.crc32(payload, zlib.crc32(length_field))


def _payload_at(data: bytes, offset: int) -> bytes | None:
    """The payload of the frame at ``offset`` if it fits ``data`` and passes its CRC, else None."""
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
    except msgspec.DecodeError:
        return None


def _next_frame(data: bytes, start: int, after_seq: int,
                decoder: msgspec.msgpack.Decoder[Change]) -> tuple[int, Change, int] | None:
    """The first offset at or after ``start`` holding a valid frame with ``seq > after_seq``; only offsets
    whose payload opens like a ``Change`` (a fixmap whose first key is "seq") are checked."""
    position = start + _HEADER.size + 1
    while (hit := data.find(_CHANGE_KEY, position)) >= 0:
        offset = hit - _HEADER.size - 1
        position = hit + 1
        if data[hit - 1] & 0xF0 != 0x80:
            continue
        found = _change_at(data, offset, decoder)
        if found is not None and found[0].seq > after_seq:
            return offset, *found
    return None


def scan_legacy_journal(data: bytes) -> SegmentScan:
    """Every valid frame of a journal of the previous format: in place while they chain, then by resyncing."""
    decoder = msgspec.msgpack.Decoder(Change)
    changes: list[Change] = []
    skipped: list[tuple[int, int]] = []
    offset = 0
    while offset < len(data):
        found = _change_at(data, offset, decoder)
        if found is None:
            resync = _next_frame(data, offset + 1, changes[-1].seq if changes else 0, decoder)
            if resync is None:
                break
            skipped.append((offset, resync[0] - offset))
            found = resync[1:]
        changes.append(found[0])
        offset = found[1]
    return SegmentScan(changes, skipped, offset)


def read_legacy_snapshot(path: Path) -> LoadedGeneration:
    """``memory.snapshot`` of format 1 or 2, up to its first damaged frame (read a frame at a time)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        frames = _snapshot_frames(file, size)
        offset, head = next(frames, (0, None))
        try:
            form = None if head is None else msgspec.msgpack.decode(head, type=_FormatOnly).format
            if form == 1:
                whole = msgspec.msgpack.decode(head, type=_SnapshotV1)
                snapshot = Snapshot(whole.seq, whole.dim, whole.entries, whole.meta_plans, whole.last_clear_at)
                return LoadedGeneration(path, snapshot, _tail(_HEADER.size + len(head), size), [])
            if form == 2:
                return _read_v2(path, msgspec.msgpack.decode(head, type=_HeadV2), frames, size)
        except msgspec.DecodeError:
            pass
    return LoadedGeneration(path, None, [(0, size)], [])


def _snapshot_frames(file: BinaryIO, size: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset, payload) of each frame in turn; the payload is None for the first that fails (the last)."""
    offset = 0
    while header := file.read(_HEADER.size):
        length, crc = _HEADER.unpack(header) if len(header) == _HEADER.size else (size, 0)
        payload = file.read(length) if length <= size - offset - _HEADER.size else b""
        if len(payload) != length or _crc(header[:4], payload) != crc:
            yield offset, None
            return
        yield offset, payload
        offset += _HEADER.size + length


def _read_v2(path: Path, head: _HeadV2, frames: Iterator[tuple[int, bytes | None]], size: int) -> LoadedGeneration:
    decoder = msgspec.msgpack.Decoder(_PartV2)
    entries: list[MemoryEntry] = []
    meta_plans: list[MetaPlanPair] = []
    end = size
    for offset, payload in frames:
        try:
            part = None if payload is None else decoder.decode(payload)
        except msgspec.DecodeError:
            part = None
        if part is None:
            end = offset
            break
        entries += part.entries
        meta_plans += part.meta_plans
    snapshot = Snapshot(head.seq, head.dim, entries, meta_plans, head.last_clear_at)
    return LoadedGeneration(path, snapshot, _tail(end, size), [], head.num_entries - len(entries),
                            head.num_meta_plans - len(meta_plans))


def _tail(end: int, size: int) -> list[tuple[int, int]]:
    """The bytes after the last frame read, as a damaged run (none when the file ends there)."""
    return [(end, size - end)] if end < size else []
