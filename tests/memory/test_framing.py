"""The frame of every memory file: payloads of any bytes round-trip, 0xFF appears only where a frame starts,
any one damaged byte loses one frame at most, and reading a file a chunk at a time finds the same frames."""

from __future__ import annotations

import io
import random

import pytest

from mia_engine.memory import framing
from mia_engine.memory.framing import frame, frames, read_frames

HEADER = b"a header line\n"


def _payloads(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randint(0, 60)) + b"\xfe\xff\xfe\x01\xfe\x02" * rng.randint(0, 2) for _ in range(5)]


def test_payloads_round_trip_and_0xff_only_starts_frames() -> None:
    rng = random.Random(0)
    for _ in range(50):
        payloads = _payloads(rng)
        data = HEADER + b"".join(frame(p) for p in payloads)
        assert [payload for _, _, payload in frames(data, len(HEADER))] == payloads
        assert data.count(b"\xff") == len(payloads)


def test_any_one_damaged_byte_loses_one_frame_at_most() -> None:
    payloads = _payloads(random.Random(1))
    data = HEADER + b"".join(frame(p) for p in payloads)
    for position in range(len(HEADER), len(data)):
        for value in {0x00, 0xFE, 0xFF, data[position] ^ 0x40, data[position] ^ 0x01} - {data[position]}:
            damaged = bytearray(data)
            damaged[position] = value
            kept = [payload for _, _, payload in frames(bytes(damaged), len(HEADER)) if payload is not None]
            assert len(kept) >= len(payloads) - 1 and all(payload in payloads for payload in kept), position


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_reading_a_chunk_at_a_time_finds_the_same_frames(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(framing, "_READ_CHUNK", chunk)
    rng = random.Random(chunk)
    data = HEADER + b"".join(frame(p) for p in _payloads(rng)) + b"a torn tail"
    assert list(read_frames(io.BytesIO(data), len(HEADER))) == list(frames(data, len(HEADER)))
