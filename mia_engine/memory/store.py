"""The durable experience store: workflow memories and Meta Plan pairs, their indexes and journal.

Synchronous and single-threaded by design: ``MemoryService`` runs every call on one store thread,
which serialises writes without locks and keeps disk I/O off the event loop. Every mutation is
built as a ``Change`` against the current state, validated, journaled (the durability point),
and only then applied in memory, so what is in memory is always what a restart would rebuild.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import torch

from ..devices import resolve_device
from .blas import blas_thread_cap
from .buckets import Bucket, ScoredRow, ScoreFn
from ..config.memory import MemoryConfig
from .consolidation import entries_to_clear, should_replace
from .entries import (
    AddResult,
    BucketKey,
    BucketStats,
    ClearResult,
    ConsolidationResult,
    InvalidMemory,
    MemoryEntry,
    MemoryHit,
    MemoryNotFound,
    MemoryStats,
    MetaPlanHit,
    MetaPlanPair,
    RecordTooLarge,
    SearchResult,
    StoredRecord,
    vector_from_bytes,
)
from .index import gpu_resources
from .journal import Change, CountUpdate, Journal, Snapshot
from .meta_plans import MetaPlanMemory
from .validation import bucket_key, validated_entry, validated_pair, validated_record

logger = logging.getLogger(__name__)

_NUM_DUPLICATE_CANDIDATES = 8
_CHANGE_OVERHEAD_BYTES = 256  # a Change's own fields and list headers around its records, generously


class SearchQuery(NamedTuple):
    """One retrieval: embedded question (and caption) keys, the bucket, how many of each label."""

    query_q: np.ndarray
    query_c: np.ndarray | None
    bucket: BucketKey
    num_positive: int
    num_negative: int


class ExperienceStore:
    """Workflow memory + Meta Plan Memory with crash-safe persistence under ``data_dir``."""

    def __init__(
        self,
        config: MemoryConfig,
        dim: int,
        journal: Journal,
        *,
        clock: Callable[[], float],
        score_fn: ScoreFn,
    ) -> None:
        self._config = config
        self._dim = dim
        self._journal = journal
        self._clock = clock
        self._score_fn = score_fn
        self._device = _score_device(config.score_device)
        self._blas_cap = blas_thread_cap(config.score_cpu_threads if self._device.type == "cpu" else 0)
        self._faiss_resources = gpu_resources(config.index_device)
        self._entries: dict[str, MemoryEntry] = {}
        self._buckets: dict[BucketKey, Bucket] = {}
        self._meta_plans = MetaPlanMemory(dim, self._faiss_resources)
        self._last_clear_at: float | None = None
        self._seq = 0
        self._num_since_snapshot = 0
        self._snapshot_retry_at = -math.inf
        """Clock time before which no periodic snapshot is tried (set after a failure)."""
        self._snapshot_backoff_s = config.durability.snapshot_retry_s
        """Wait after the next failure; doubles per consecutive failure, reset by a success."""

    @classmethod
    def open(
        cls,
        data_dir: str | Path,
        config: MemoryConfig,
        dim: int,
        *,
        clock: Callable[[], float] = time.time,
        score_fn: ScoreFn | None = None,
    ) -> ExperienceStore:
        """Restore the exact state left by the last acknowledged write (snapshot + journal replay)."""
        journal, recovered = Journal.open(Path(data_dir), config.durability)
        store = cls(config, dim, journal, clock=clock, score_fn=score_fn or _default_score_fn())
        try:
            if recovered.snapshot is not None:
                store._restore(recovered.snapshot)
            for change in recovered.changes:
                store._apply(change)
        except Exception:
            journal.close()
            raise
        store._num_since_snapshot = len(recovered.changes)
        if recovered.num_damaged_bytes:
            store._compact_after_damage()
        return store

    # ---- reads ---------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._entries

    def get(self, entry_id: str) -> MemoryEntry:
        entry = self._entries.get(entry_id)
        if entry is None:
            raise MemoryNotFound(f"no memory with id {entry_id!r}")
        return entry

    def bucket_key(self, modality: str, category: str | None) -> BucketKey:
        """Validated bucket of a query or memory; a missing category is the configured default."""
        return bucket_key(self._config, modality, category)

    def search(
        self,
        query_q: np.ndarray,
        query_c: np.ndarray | None,
        bucket: BucketKey,
        *,
        num_positive: int,
        num_negative: int,
    ) -> SearchResult:
        """Top positives and negatives of the bucket by the paper's score, with its terms."""
        return self.search_many([SearchQuery(query_q, query_c, bucket, num_positive, num_negative)])[0]

    def search_many(self, queries: Sequence[SearchQuery]) -> list[SearchResult]:
        """``search`` for several queries, one kernel call per bucket (results in the queries' order)."""
        results: list[SearchResult | None] = [None] * len(queries)
        by_bucket: dict[BucketKey, list[int]] = {}
        for i, query in enumerate(queries):
            by_bucket.setdefault(query.bucket, []).append(i)
        floor = self._config.min_similarity
        for bucket, members in by_bucket.items():
            found = self._buckets.get(bucket)
            k = max(max(queries[i].num_positive, queries[i].num_negative) for i in members)
            if found is None or k <= 0:
                ranked = [([], [])] * len(members)
            else:
                with self._blas_cap():
                    ranked = found.top_k(np.stack([queries[i].query_q for i in members]),
                                         [queries[i].query_c for i in members], k, self._config.score,
                                         self._score_fn, self._config.score_backend)
            for i, (positives, negatives) in zip(members, ranked):
                query = queries[i]
                results[i] = SearchResult(
                    str(bucket),
                    self._hits([row for row in positives[:query.num_positive] if row.sim >= floor]),
                    self._hits([row for row in negatives[:query.num_negative] if row.sim >= floor]))
        return [result for result in results if result is not None]

    def search_meta_plans(self, query: np.ndarray, k: int) -> list[MetaPlanHit]:
        return [hit for hit in self._meta_plans.search(query, k) if hit.similarity >= self._config.min_similarity]

    def export_records(self) -> list[StoredRecord]:
        """Every memory and pair as stored (frozen structs, safe to encode from another thread)."""
        return [*self._entries.values(), *self._meta_plans.pairs()]

    def stats(self) -> MemoryStats:
        buckets = {
            str(key): BucketStats(bucket.count(True), bucket.count(False))
            for key, bucket in sorted(self._buckets.items())
            if len(bucket)
        }
        return MemoryStats(
            num_entries=len(self._entries),
            num_meta_plans=len(self._meta_plans),
            buckets=buckets,
            dim=self._dim,
            journal_seq=self._seq,
            num_records_since_snapshot=self._num_since_snapshot,
        )

    # ---- writes --------------------------------------------------------------------------

    def add(self, entry: MemoryEntry) -> AddResult:
        """Insert, or replace a same-bucket same-label duplicate (cosine >= ``replace_threshold``)."""
        result, change = self._plan_add(self._stamped(entry))
        if change.put_entries:
            self._commit(change)
        return result

    def consolidate(
        self, positive: MemoryEntry | None, negative: MemoryEntry | None, pair: MetaPlanPair | None
    ) -> ConsolidationResult:
        """Store one question's outcome atomically: a positive, a negative and their Meta Plan pair."""
        results: list[AddResult | None] = []
        puts: list[MemoryEntry] = []
        deletes: list[str] = []
        for entry in (positive, negative):  # different labels, so they never duplicate each other
            if entry is None:
                results.append(None)
                continue
            result, change = self._plan_add(self._stamped(entry))
            results.append(result)
            puts += change.put_entries
            deletes += change.delete_entries
        pairs = [validated_pair(self._stamped_pair(pair), self._config, self._dim)] if pair is not None else []
        if puts or pairs:
            self._commit(Change(0, put_entries=puts, delete_entries=deletes, put_meta_plans=pairs))
        return ConsolidationResult(results[0], results[1], pairs[0].id if pairs else None)

    def delete(self, entry_id: str) -> None:
        self.get(entry_id)
        self._commit(Change(0, delete_entries=[entry_id]))

    def record_outcome(self, used_ids: Iterable[str], success: bool) -> int:
        """u += 1 (and s += 1 on success) for each memory a query used; ids since replaced or
        cleared are skipped. Returns how many memories were updated."""
        now = self._clock()
        updates = [
            CountUpdate(entry.id, entry.num_uses + 1, entry.num_successes + int(success), now)
            for entry in (self._entries.get(entry_id) for entry_id in dict.fromkeys(used_ids))
            if entry is not None
        ]
        if updates:
            self._commit(Change(0, counts=updates))
        return len(updates)

    def add_meta_plan(self, pair: MetaPlanPair) -> MetaPlanPair:
        pair = validated_pair(self._stamped_pair(pair), self._config, self._dim)
        self._commit(Change(0, put_meta_plans=[pair]))
        return pair

    def delete_meta_plan(self, pair_id: str) -> None:
        if pair_id not in self._meta_plans:
            raise MemoryNotFound(f"no meta plan pair with id {pair_id!r}")
        self._commit(Change(0, delete_meta_plans=[pair_id]))

    def clear_after_update(self) -> ClearResult:
        """The selective clearing run after each learning update (``MemoryConfig.clear_policy``)."""
        removed = entries_to_clear(
            self._entries.values(),
            self._config.clear_policy,
            max_num_entries=self._config.max_num_entries,
            last_clear_at=self._last_clear_at,
        )
        removed_pairs = self._meta_plans.oldest_beyond(self._config.max_num_meta_plans)
        self._commit(Change(0, delete_entries=removed, delete_meta_plans=removed_pairs, cleared_at=self._clock()))
        return ClearResult(removed, removed_pairs)

    def import_records(self, records: Sequence[StoredRecord]) -> int:
        """Upsert exported records verbatim (ids, counters and times kept; no replacement rule).

        Written in changes of at most one journal record each, so every one replays; a record too
        large for a change of its own is refused (``RecordTooLarge``) before anything is written."""
        validated = [validated_record(record, self._config, self._dim) for record in records]
        num_entries = sum(isinstance(r, MemoryEntry) for r in validated)
        if num_entries > self._config.max_num_stored:
            raise InvalidMemory(f"the import holds {num_entries} memories; the store keeps at most "
                                f"{self._config.max_num_stored} (memory.max_num_stored)")
        for chunk in _chunks_by_bytes(validated, self._journal.max_record_bytes - _CHANGE_OVERHEAD_BYTES):
            self._commit(
                Change(
                    0,
                    put_entries=[r for r in chunk if isinstance(r, MemoryEntry)],
                    put_meta_plans=[r for r in chunk if isinstance(r, MetaPlanPair)],
                )
            )
        return len(validated)

    def compact(self) -> None:
        """Write a snapshot now and empty the journal (also done every ``snapshot_interval`` writes)."""
        snapshot = Snapshot(
            seq=self._seq,
            dim=self._dim,
            entries=list(self._entries.values()),
            meta_plans=self._meta_plans.pairs(),
            last_clear_at=self._last_clear_at,
        )
        self._journal.write_snapshot(snapshot)
        self._num_since_snapshot = 0

    def close(self) -> None:
        self._journal.close()

    # ---- internals -----------------------------------------------------------------------

    def _commit(self, change: Change) -> None:
        change = msgspec.structs.replace(self._with_room(change), seq=self._seq + 1)
        self._journal.append(change)  # the durability point: acknowledged from here on
        self._apply(change)
        self._num_since_snapshot += 1
        if self._num_since_snapshot >= self._config.durability.snapshot_interval:
            self._periodic_snapshot()

    def _with_room(self, change: Change) -> Change:
        """``change`` plus the clearing that keeps the store within ``max_num_stored`` once it is applied."""
        return self._with_room_for_pairs(self._with_room_for_entries(change))

    def _with_room_for_pairs(self, change: Change) -> Change:
        """The same capacity for Meta Plan pairs, oldest dropped first (one pair per learning question
        with a success and a failure: unbounded, they grow a long-running server's memory for ever)."""
        capacity = self._config.max_num_stored
        new_ids = {p.id for p in change.put_meta_plans if p.id not in self._meta_plans}
        num_deleted = sum(1 for pair_id in set(change.delete_meta_plans) if pair_id in self._meta_plans)
        if len(self._meta_plans) - num_deleted + len(new_ids) <= capacity:
            return change
        if len(new_ids) > capacity:
            raise InvalidMemory(f"this change adds {len(new_ids)} Meta Plan pairs; the store keeps at most "
                                f"{capacity} (memory.max_num_stored)")
        keep = max(1, int(capacity * self._config.clear_to_fraction) - len(new_ids))
        protected = {p.id for p in change.put_meta_plans} | set(change.delete_meta_plans)
        removed = [pair_id for pair_id in self._meta_plans.oldest_beyond(keep) if pair_id not in protected]
        logger.info("Meta Plan Memory at its capacity (%d): clearing the %d oldest pairs", capacity, len(removed))
        return msgspec.structs.replace(change, delete_meta_plans=[*change.delete_meta_plans, *removed])

    def _with_room_for_entries(self, change: Change) -> Change:
        new_ids = {e.id for e in change.put_entries if e.id not in self._entries}
        num_deleted = sum(1 for entry_id in set(change.delete_entries) if entry_id in self._entries)
        num_after = len(self._entries) - num_deleted + len(new_ids)
        if num_after <= self._config.max_num_stored:
            return change
        if len(new_ids) > self._config.max_num_stored:
            raise InvalidMemory(f"this change adds {len(new_ids)} memories; the store keeps at most "
                                f"{self._config.max_num_stored} (memory.max_num_stored)")
        protected = {e.id for e in change.put_entries} | set(change.delete_entries)
        candidates = [e for e in self._entries.values() if e.id not in protected]
        keep = max(0, int(self._config.max_num_stored * self._config.clear_to_fraction) - len(new_ids))
        removed = entries_to_clear(candidates, "cap", max_num_entries=keep, last_clear_at=None)
        logger.info("memory store at its capacity (%d): clearing %d lowest-value memories",
                    self._config.max_num_stored, len(removed))
        return msgspec.structs.replace(change, delete_entries=[*change.delete_entries, *removed])

    def _periodic_snapshot(self) -> None:
        """A failed snapshot must not fail the write that triggered it: that write is already durable.

        Any error is logged and the next attempt waits (``durability.snapshot_retry_s``, doubling)."""
        now = self._clock()
        if now < self._snapshot_retry_at:
            return
        try:
            self.compact()
        except Exception as err:  # noqa: BLE001 - whatever failed, the acknowledged write stands
            delay = self._snapshot_backoff_s
            self._snapshot_retry_at = now + delay
            self._snapshot_backoff_s = min(2 * delay, self._config.durability.max_snapshot_retry_s)
            logger.warning("memory snapshot failed (%s: %s); the writes are durable in the journal, which keeps "
                           "growing until a snapshot succeeds; next try in %.0f s", type(err).__name__, err, delay)
            return
        self._snapshot_retry_at = -math.inf
        self._snapshot_backoff_s = self._config.durability.snapshot_retry_s

    def _compact_after_damage(self) -> None:
        """Replay skipped damaged journal bytes (copied aside): a snapshot now leaves a clean journal."""
        try:
            self.compact()
        except Exception as err:  # noqa: BLE001 - the store is whole in memory; the next start resyncs again
            logger.warning("memory journal: compacting after skipping damaged bytes failed (%s: %s); the next "
                           "start will skip them again", type(err).__name__, err)
            return
        logger.warning("memory journal: rewritten as a snapshot after skipping damaged bytes; %d memories, "
                       "%d Meta Plan pairs", len(self._entries), len(self._meta_plans))

    def _apply(self, change: Change) -> None:
        self._remove_entries(change.delete_entries)  # one batch: each index compacts once at most
        for entry in change.put_entries:
            self._remove_entries((entry.id,))
            self._insert_entry(entry)
        for update in change.counts:
            self._set_counts(update)
        self._meta_plans.remove_many(change.delete_meta_plans)
        for pair in change.put_meta_plans:
            self._meta_plans.put(pair)
        if change.cleared_at is not None:
            self._last_clear_at = change.cleared_at
        self._seq = change.seq

    def _restore(self, snapshot: Snapshot) -> None:
        if snapshot.dim != self._dim:
            raise InvalidMemory(
                f"the snapshot was written with {snapshot.dim}-d embeddings, the encoder gives {self._dim}"
            )
        for entry in snapshot.entries:
            self._insert_entry(entry)
        for pair in snapshot.meta_plans:
            self._meta_plans.put(pair)
        self._last_clear_at = snapshot.last_clear_at
        self._seq = snapshot.seq

    def _insert_entry(self, entry: MemoryEntry) -> None:
        key_q = vector_from_bytes(entry.question_embedding, self._dim)
        key_c = vector_from_bytes(entry.caption_embedding, self._dim) if entry.caption_embedding else None
        bucket = self._buckets.get(entry.bucket)
        if bucket is None:
            bucket = self._buckets[entry.bucket] = Bucket(self._dim, self._device, self._faiss_resources)
        bucket.add(entry.id, entry.is_correct, key_q, key_c, (entry.num_uses, entry.num_successes))
        self._entries[entry.id] = entry

    def _remove_entries(self, entry_ids: Iterable[str]) -> None:
        by_bucket: dict[BucketKey, list[str]] = {}
        for entry_id in entry_ids:
            entry = self._entries.pop(entry_id, None)
            if entry is not None:
                by_bucket.setdefault(entry.bucket, []).append(entry_id)
        for key, removed in by_bucket.items():
            self._buckets[key].remove_many(removed)

    def _set_counts(self, update: CountUpdate) -> None:
        entry = self._entries.get(update.id)
        if entry is None:
            return
        self._entries[update.id] = msgspec.structs.replace(
            entry, num_uses=update.num_uses, num_successes=update.num_successes, updated_at=update.updated_at
        )
        self._buckets[entry.bucket].set_counts(update.id, update.num_uses, update.num_successes)

    def _plan_add(self, entry: MemoryEntry) -> tuple[AddResult, Change]:
        """The change ``add`` would make, without making it."""
        entry = validated_entry(entry, self._config, self._dim)
        if entry.id in self._entries:
            raise InvalidMemory(f"a memory with id {entry.id!r} already exists")
        existing = self._find_duplicate(entry)
        if existing is None:
            return AddResult(entry.id, "inserted"), Change(0, put_entries=[entry])
        if should_replace(existing, entry):
            change = Change(0, put_entries=[entry], delete_entries=[existing.id])
            return AddResult(entry.id, "replaced", existing.id), change
        return AddResult(existing.id, "kept_existing"), Change(0)

    def _find_duplicate(self, entry: MemoryEntry) -> MemoryEntry | None:
        """Nearest same-bucket, same-label memory whose question (and caption, if any) match."""
        bucket = self._buckets.get(entry.bucket)
        if bucket is None:
            return None
        key_q = vector_from_bytes(entry.question_embedding, self._dim)
        threshold = self._config.replace_threshold
        for candidate_id, sim in bucket.nearest(entry.is_correct, key_q, _NUM_DUPLICATE_CANDIDATES):
            if sim < threshold:
                break
            candidate = self._entries[candidate_id]
            if self._captions_match(entry, candidate):
                return candidate
        return None

    def _captions_match(self, a: MemoryEntry, b: MemoryEntry) -> bool:
        """Same question on a different image is a different memory."""
        if not a.caption_embedding or not b.caption_embedding:
            return not a.caption_embedding and not b.caption_embedding
        key_a = vector_from_bytes(a.caption_embedding, self._dim)
        cos = float(key_a @ vector_from_bytes(b.caption_embedding, self._dim))
        return cos >= self._config.replace_threshold

    def _stamped(self, entry: MemoryEntry) -> MemoryEntry:
        now = self._clock()
        return msgspec.structs.replace(entry, created_at=now, updated_at=now)

    def _stamped_pair(self, pair: MetaPlanPair) -> MetaPlanPair:
        return msgspec.structs.replace(pair, created_at=self._clock())

    def _hits(self, rows: list[ScoredRow]) -> list[MemoryHit]:
        return [
            MemoryHit(self._entries[row.entry_id], row.score, row.sim, row.sim_norm, row.value, row.freq)
            for row in rows
        ]


def _chunks_by_bytes(records: Sequence[StoredRecord], max_bytes: int) -> list[list[StoredRecord]]:
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


def _score_device(name: str) -> torch.device:
    return torch.device(resolve_device(name))


def store_device(config: MemoryConfig) -> str:
    """The GPU the store's thread is bound to (``devices.bind_thread``): the score's, else the FAISS
    index's (FAISS switches to its GPU and back to the thread's device for every call), else the CPU."""
    for name in (config.score_device, config.index_device):
        device = resolve_device(name)
        if device != "cpu":
            return device
    return "cpu"


def _default_score_fn() -> ScoreFn:
    """Imported lazily: the kernel module pulls in Triton where it is available."""
    from mia_kernels.memory_score import memory_topk

    return memory_topk
