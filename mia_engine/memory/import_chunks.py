"""An import cut into journal changes: each change holds as many records as fit in one journal record, so
every one replays (``memory.durability.max_record_bytes``)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .entries import MemoryEntry, MetaPlanPair, RecordTooLarge, StoredRecord
from .journal import Change

CHANGE_OVERHEAD_BYTES = 256  # a Change's own fields and list headers around its records, generously


def import_changes(records: Sequence[StoredRecord], max_record_bytes: int) -> list[Change]:
    """Changes (seq 0: the store numbers them) that put ``records``, in order; a record too large for a
    change of its own raises ``RecordTooLarge`` before any change is made."""
    return [
        Change(
            0,
            put_entries=[r for r in chunk if isinstance(r, MemoryEntry)],
            put_meta_plans=[r for r in chunk if isinstance(r, MetaPlanPair)],
        )
        for chunk in chunks_by_bytes(records, max_record_bytes - CHANGE_OVERHEAD_BYTES)
    ]


def chunks_by_bytes(records: Sequence[StoredRecord], max_bytes: int) -> list[list[StoredRecord]]:
    """Consecutive runs of records whose msgpack sizes add up to at most ``max_bytes`` each."""
    encoder = msgspec.msgpack.Encoder()
    chunks: list[list[StoredRecord]] = []
    chunk: list[StoredRecord] = []
    num_bytes = 0
    for index, record in enumerate(records):
        size = len(encoder.encode(record))
        if size > max_bytes:
            raise RecordTooLarge(f"record {index} ({record.id!r}) takes {size} bytes; a journal change holds at "
                                 f"most {max_bytes} (memory.durability.max_record_bytes)")
        if chunk and num_bytes + size > max_bytes:
            chunks.append(chunk)
            chunk, num_bytes = [], 0
        chunk.append(record)
        num_bytes += size
    if chunk:
        chunks.append(chunk)
    return chunks
