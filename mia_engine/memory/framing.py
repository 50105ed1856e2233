"""The frame every memory file is made of (journal segments, snapshot generations), found again after damage.

A frame is the byte 0xFF; its header: the length of the payload as written, then a CRC-32 over that length
field and the payload as written, each as 5 digits of 7 bits (bytes below 0x80); then the payload, with every
0xFE in it written as 0xFE 0x01 and every 0xFF as 0xFE 0x02. So 0xFF appears in a file only where a frame
starts: reading after damage resumes at the next 0xFF, a damaged frame loses only itself (one whose 0xFF was
damaged is found where the frame before it ends), and no byte a record holds can start a frame, however it
was crafted: text is stored as raw UTF-8, which has no 0xFF byte, and binary fields are escaped. Escaping
costs 2 bytes in 256 of random binary data and nothing for text.

A file opens with a header line (ASCII) that names what it is and its format.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..base.files import fsync_dir

MARK = b"\xff"
"""The byte that starts every frame and appears nowhere else."""
_ESCAPE = b"\xfe"
_ESCAPED_ESCAPE = b"\xfe\x01"
_ESCAPED_MARK = b"\xfe\x02"
_NUM_DIGITS = 5
"""7-bit digits of the length and of the CRC: 35 bits."""
HEADER_SIZE = 1 + 2 * _NUM_DIGITS
FILE_MODE = 0o600
"""Every memory file: memories can hold anything a user asked."""
CORRUPT_SUFFIX = ".corrupt-"
"""Damaged bytes are copied to ``<file>.corrupt-<unix time ns>-at-<offset>`` (never deleted)."""
_READ_CHUNK = 1 << 20

Frame = tuple[int, int, bytes | None]
"""(offset, end, payload) of a frame in a file; the payload is None for a run of bytes that is not one."""


def frame(payload: bytes) -> bytes:
    """The frame holding ``payload``."""
    body = payload.replace(_ESCAPE, _ESCAPED_ESCAPE).replace(MARK, _ESCAPED_MARK)
    length = _digits(len(body))
    return MARK + length + _digits(zlib.crc32(body, zlib.crc32(length))) + body


def _digits(number: int) -> bytes:
    return bytes((number >> (7 * i)) & 0x7F for i in range(_NUM_DIGITS))


def _number(digits: bytes | memoryview) -> int | None:
    if any(digit & 0x80 for digit in digits):
        return None
    return sum(digit << (7 * i) for i, digit in enumerate(digits))


def frames(data: bytes, start: int) -> Iterator[Frame]:
    """Each frame of ``data`` after ``start``, and each run of bytes that is not one."""
    for offset, end in runs(data, start):
        yield from frames_in_run(data, offset, end)


def read_frames(file: BinaryIO, start: int) -> Iterator[Frame]:
    """``frames`` of an open file, read a run at a time (a snapshot can be larger than memory twice over)."""
    for offset, run in read_runs(file, start):
        for frame_start, frame_end, payload in frames_in_run(run, 0, len(run)):
            yield offset + frame_start, offset + frame_end, payload


def runs(data: bytes, start: int) -> Iterator[tuple[int, int]]:
    """(offset, end) of each run of ``data`` after ``start``: from each 0xFF up to the next (the first run may
    start without one)."""
    offset = start
    while offset < len(data):
        end = data.find(MARK, offset + 1)
        end = len(data) if end < 0 else end
        yield offset, end
        offset = end


def read_runs(file: BinaryIO, start: int) -> Iterator[tuple[int, bytes]]:
    """``runs`` of an open file, read a chunk at a time: (offset, bytes) of each."""
    file.seek(start)
    buffer, base, searched, is_eof = bytearray(), start, 1, False
    while True:
        cut = buffer.find(MARK, searched)
        if cut < 0:
            if not is_eof:
                searched = max(len(buffer), 1)
                chunk = file.read(_READ_CHUNK)
                is_eof = not chunk
                buffer += chunk
                continue
            if not buffer:
                return
            cut = len(buffer)
        yield base, bytes(buffer[:cut])
        del buffer[:cut]
        base, searched = base + cut, 1


def frames_in_run(data: bytes, offset: int, end: int) -> Iterator[Frame]:
    """The frames of the run ``data[offset:end]``: one, or more when the 0xFF of the next one was damaged
    (a frame ends where its length says; what follows it in the run is read as a frame whose first byte was
    damaged); a rest that is not a frame is yielded with None."""
    view = memoryview(data)
    while offset < end:
        stop = _frame_end(view, offset, end)
        if stop is None:
            yield offset, end, None
            return
        body = bytes(view[offset + HEADER_SIZE : stop])
        yield offset, stop, body.replace(_ESCAPED_MARK, MARK).replace(_ESCAPED_ESCAPE, _ESCAPE)
        offset = stop


def _frame_end(view: memoryview, offset: int, end: int) -> int | None:
    """Where the frame at ``offset`` ends if it lies within ``end`` and passes its CRC, else None.

    Unescaping the payload afterwards is exact: in a written payload every 0xFE opens a pair, and 0xFE is
    never the second byte of one."""
    if end - offset < HEADER_SIZE:
        return None
    length_field = view[offset + 1 : offset + 1 + _NUM_DIGITS]
    length, crc = _number(length_field), _number(view[offset + 1 + _NUM_DIGITS : offset + HEADER_SIZE])
    if length is None or crc is None or offset + HEADER_SIZE + length > end:
        return None
    stop = offset + HEADER_SIZE + length
    return stop if zlib.crc32(view[offset + HEADER_SIZE : stop], zlib.crc32(length_field)) == crc else None


def copy_aside(path: Path, offset: int, size: int) -> Path:
    """Copy ``size`` bytes of ``path`` at ``offset`` to a private side file, durably, before they are lost."""
    aside = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{time.time_ns()}-at-{offset}")
    with open(path, "rb") as source, open(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE),
                                          "wb") as target:
        source.seek(offset)
        remaining = size
        while remaining and (chunk := source.read(min(remaining, _READ_CHUNK))):
            target.write(chunk)
            remaining -= len(chunk)
        target.flush()
        os.fsync(target.fileno())
    fsync_dir(path.parent)
    return aside


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
