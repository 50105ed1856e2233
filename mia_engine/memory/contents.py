"""What the experience store holds in memory: its memories by id and by bucket, the Meta Plan pairs, the
time of the last clearing and the sequence number of the last change.

Changed only by ``apply`` (a change already journaled) and ``restore`` (a snapshot), so it is always what
a restart would rebuild; ``ExperienceStore`` decides the changes and makes them durable.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import torch

from .buckets import Bucket, ScoredRow
from .entries import BucketKey, InvalidMemory, MemoryEntry, MemoryHit, vector_from_bytes
from .index import GpuPlacement
from .journal import Change, CountUpdate, Snapshot
from .meta_plans import MetaPlanMemory

_NUM_DUPLICATE_CANDIDATES = 8


class StoreContents:
    """Workflow memories (each in its bucket's key matrices and indexes) and Meta Plan Memory."""

    def __init__(self, dim: int, device: torch.device, faiss_resources: GpuPlacement | None) -> None:
        self.dim = dim
        self._device = device
        self._faiss_resources = faiss_resources
        self.entries: dict[str, MemoryEntry] = {}
        self.buckets: dict[BucketKey, Bucket] = {}
        self.meta_plans = MetaPlanMemory(dim, faiss_resources)
        self.last_clear_at: float | None = None
        self.seq = 0

    def apply(self, change: Change) -> None:
        self._remove_entries(change.delete_entries)  # one batch: each index compacts once at most
        for entry in change.put_entries:
            self._remove_entries((entry.id,))
            self._insert_entry(entry)
        for update in change.counts:
            self._set_counts(update)
        self.meta_plans.remove_many(change.delete_meta_plans)
        for pair in change.put_meta_plans:
            self.meta_plans.put(pair)
        if change.cleared_at is not None:
            self.last_clear_at = change.cleared_at
        self.seq = change.seq

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.dim != self.dim:
            raise InvalidMemory(
                f"the snapshot was written with {snapshot.dim}-d embeddings, the encoder gives {self.dim}"
            )
        for entry in snapshot.entries:
            self._insert_entry(entry)
        for pair in snapshot.meta_plans:
            self.meta_plans.put(pair)
        self.last_clear_at = snapshot.last_clear_at
        self.seq = snapshot.seq

    def snapshot(self) -> Snapshot:
        return Snapshot(
            seq=self.seq,
            dim=self.dim,
            entries=list(self.entries.values()),
            meta_plans=self.meta_plans.pairs(),
            last_clear_at=self.last_clear_at,
        )

    def find_duplicate(self, entry: MemoryEntry, threshold: float) -> MemoryEntry | None:
        """Nearest same-bucket, same-label memory whose question (and caption, if any) match."""
        bucket = self.buckets.get(entry.bucket)
        if bucket is None:
            return None
        key_q = vector_from_bytes(entry.question_embedding, self.dim)
        for candidate_id, sim in bucket.nearest(entry.is_correct, key_q, _NUM_DUPLICATE_CANDIDATES):
            if sim < threshold:
                break
            candidate = self.entries[candidate_id]
            if self._captions_match(entry, candidate, threshold):
                return candidate
        return None

    def hits(self, rows: list[ScoredRow]) -> list[MemoryHit]:
        return [
            MemoryHit(self.entries[row.entry_id], row.score, row.sim, row.sim_norm, row.value, row.freq)
            for row in rows
        ]

    def _captions_match(self, a: MemoryEntry, b: MemoryEntry, threshold: float) -> bool:
        """Same question on a different image is a different memory."""
        if not a.caption_embedding or not b.caption_embedding:
            return not a.caption_embedding and not b.caption_embedding
        key_a = vector_from_bytes(a.caption_embedding, self.dim)
        cos = float(key_a @ vector_from_bytes(b.caption_embedding, self.dim))
        return cos >= threshold

    def _insert_entry(self, entry: MemoryEntry) -> None:
        key_q = vector_from_bytes(entry.question_embedding, self.dim)
        key_c = vector_from_bytes(entry.caption_embedding, self.dim) if entry.caption_embedding else None
        bucket = self.buckets.get(entry.bucket)
        if bucket is None:
            bucket = self.buckets[entry.bucket] = Bucket(self.dim, self._device, self._faiss_resources)
        bucket.add(entry.id, entry.is_correct, key_q, key_c, (entry.num_uses, entry.num_successes))
        self.entries[entry.id] = entry

    def _remove_entries(self, entry_ids: Iterable[str]) -> None:
        by_bucket: dict[BucketKey, list[str]] = {}
        for entry_id in entry_ids:
            entry = self.entries.pop(entry_id, None)
            if entry is not None:
                by_bucket.setdefault(entry.bucket, []).append(entry_id)
        for key, removed in by_bucket.items():
            self.buckets[key].remove_many(removed)

    def _set_counts(self, update: CountUpdate) -> None:
        entry = self.entries.get(update.id)
        if entry is None:
            return
        self.entries[update.id] = msgspec.structs.replace(
            entry, num_uses=update.num_uses, num_successes=update.num_successes, updated_at=update.updated_at
        )
        self.buckets[entry.bucket].set_counts(update.id, update.num_uses, update.num_successes)
