"""Export/import format: one JSON record per line, tagged by ``kind`` ("entry" | "meta_plan").

Records carry every field, counters and timestamps included, and embeddings as base64 float32,
so an export imported into an empty store restores it exactly; an import line may leave an
embedding empty to have the service compute it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from .entries import InvalidMemory, StoredRecord

_LINES_PER_CHUNK = 64


def encode_jsonl(records: Iterable[StoredRecord]) -> Iterator[bytes]:
    """Chunks of complete lines, so a large export streams instead of being built in memory."""
    encoder = msgspec.json.Encoder()
    chunk = bytearray()
    for num_lines, record in enumerate(records, start=1):
        encoder.encode_into(record, chunk, -1)
        chunk += b"\n"
        if num_lines % _LINES_PER_CHUNK == 0:
            yield bytes(chunk)
            chunk.clear()
    if chunk:
        yield bytes(chunk)


def decode_jsonl(data: bytes | bytearray, first_line: int = 1) -> list[StoredRecord]:
    """Every non-blank line decoded and type-checked; the first bad line is named in the error (numbered
    from ``first_line``: a caller decoding a body slice by slice)."""
    decoder = msgspec.json.Decoder(StoredRecord)
    records: list[StoredRecord] = []
    for line_number, line in enumerate(data.splitlines(), start=first_line):
        if not line.strip():
            continue
        try:
            records.append(decoder.decode(line))
        except msgspec.DecodeError as err:  # ValidationError is a DecodeError
            raise InvalidMemory(f"line {line_number}: {err}") from None
        except RecursionError:  # msgspec's depth guard
            raise InvalidMemory(f"line {line_number}: arrays and objects are nested too deeply") from None
    return records
