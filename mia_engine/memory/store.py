"""The durable experience store: workflow memories and Meta Plan pairs, their indexes and journal.

Synchronous and single-threaded by design: ``MemoryService`` runs every call on one store thread,
which serialises writes without locks and keeps disk I/O off the event loop. Every mutation is
built as a ``Change`` against the current state, validated, journaled (the durability point),
and only then applied to ``StoreContents`` (``contents.py``), so what is in memory is always what a
restart would rebuild. Snapshots are taken on the store thread (lists of the frozen records) and
written on a thread of their own (``snapshot.py: SnapshotWriter``), so no write or search waits for one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path

import msgspec
import numpy as np

from ..config.memory import MemoryConfig
from .blas import blas_thread_cap
from .buckets import ScoreFn
from .capacity import with_room
from .consolidation import entries_to_clear, should_replace
from .contents import StoreContents
from .entries import (
    AddResult,
    BucketKey,
    BucketStats,
    ClearResult,
    ConsolidationResult,
    InvalidMemory,
    MemoryEntry,
    MemoryNotFound,
    MemoryStats,
    MetaPlanHit,
    MetaPlanPair,
    SearchResult,
    StoredRecord,
)
from .import_chunks import import_changes
from .index import gpu_resources, set_faiss_threads
from .journal import Change, CountUpdate, Journal
from .recovery import recover
from .retrieval import SearchQuery, search_many
from .snapshot import SnapshotWriter
from .store_devices import score_device
from .validation import bucket_key, validated_entry, validated_pair, validated_record

logger = logging.getLogger(__name__)


class ExperienceStore:
    """Workflow memory + Meta Plan Memory with crash-safe persistence under ``data_dir``."""

    def __init__(
        self,
        config: MemoryConfig,
        dim: int,
        journal: Journal,
        writer: SnapshotWriter,
        *,
        clock: Callable[[], float],
        score_fn: ScoreFn,
    ) -> None:
        self._config = config
        self._dim = dim
        self._journal = journal
        self._writer = writer
        self._clock = clock
        self._score_fn = score_fn
        device = score_device(config.score_device)
        self._blas_cap = blas_thread_cap(config.score_cpu_threads if device.type == "cpu" else 0)
        set_faiss_threads(config.faiss_threads)  # on the store's thread: OpenMP's count is per thread
        self._contents = StoreContents(dim, device, gpu_resources(config.index_device))
        self._snapshot_retry_at = -math.inf
        """Clock time before which no periodic snapshot is tried (set after a failure)."""
        self._snapshot_backoff_s = config.durability.snapshot_retry_s
        """Wait after the next failure; doubles per consecutive failure, reset by a success."""
        self._snapshot_started_at = 0.0
        """Clock time the background snapshot write was started (its failure's wait counts from there)."""

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
        """Restore the exact state left by the last acknowledged write (snapshot + journal replay); damage loses
        only what it hit (``recovery.py``), and is compacted away at once."""
        journal, recovered = recover(Path(data_dir), config.durability)
        writer = SnapshotWriter(Path(data_dir), recovered.floor)
        try:
            store = cls(config, dim, journal, writer, clock=clock, score_fn=score_fn or _default_score_fn())
            if recovered.snapshot is not None:
                store._contents.restore(recovered.snapshot)
            for change in recovered.changes:
                store._contents.apply(change)
        except BaseException:
            writer.close()
            journal.close()
            raise
        if recovered.num_damaged_bytes or recovered.damaged_generations:
            store._compact_after_damage(recovered.damaged_generations)
        return store

    # ---- reads ---------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return len(self._contents.entries)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._contents.entries

    def get(self, entry_id: str) -> MemoryEntry:
        entry = self._contents.entries.get(entry_id)
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
        return search_many(self._contents, queries, self._config, self._score_fn, self._blas_cap)

    def search_meta_plans(self, query: np.ndarray, k: int) -> list[MetaPlanHit]:
        hits = self._contents.meta_plans.search(query, k)
        return [hit for hit in hits if hit.similarity >= self._config.min_similarity]

    def export_records(self) -> list[StoredRecord]:
        """Every memory and pair as stored (frozen structs, safe to encode from another thread)."""
        return [*self._contents.entries.values(), *self._contents.meta_plans.pairs()]

    def stats(self) -> MemoryStats:
        buckets = {
            str(key): BucketStats(bucket.count(True), bucket.count(False))
            for key, bucket in sorted(self._contents.buckets.items())
            if len(bucket)
        }
        return MemoryStats(
            num_entries=len(self._contents.entries),
            num_meta_plans=len(self._contents.meta_plans),
            buckets=buckets,
            dim=self._dim,
            journal_seq=self._contents.seq,
            num_records_since_snapshot=self._contents.seq - self._writer.durable_seq,
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
            for entry in (self._contents.entries.get(entry_id) for entry_id in dict.fromkeys(used_ids))
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
        if pair_id not in self._contents.meta_plans:
            raise MemoryNotFound(f"no meta plan pair with id {pair_id!r}")
        self._commit(Change(0, delete_meta_plans=[pair_id]))

    def clear_after_update(self) -> ClearResult:
        """The selective clearing run after each learning update (``MemoryConfig.clear_policy``)."""
        removed = entries_to_clear(
            self._contents.entries.values(),
            self._config.clear_policy,
            max_num_entries=self._config.max_num_entries,
            last_clear_at=self._contents.last_clear_at,
        )
        removed_pairs = self._contents.meta_plans.oldest_beyond(self._config.max_num_meta_plans)
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
        for change in import_changes(validated, self._journal.max_record_bytes):
            self._commit(change)
        return len(validated)

    def compact(self, damaged: Sequence[Path] = ()) -> None:
        """Write a snapshot now, on this thread (also done in the background every ``snapshot_interval``
        writes); ``damaged`` generation files are removed once it is durable."""
        self.wait_for_snapshot()
        snapshot = self._contents.snapshot()
        self._journal.seal(snapshot.seq)
        self._writer.write(snapshot, damaged)

    def wait_for_snapshot(self) -> None:
        """Until the background snapshot write, if one is running, has finished (its outcome is logged)."""
        self._writer.wait()
        self._note_snapshot_outcome()

    def close(self) -> None:
        self._writer.close()
        self._journal.close()

    # ---- internals -----------------------------------------------------------------------

    def _commit(self, change: Change) -> None:
        change = with_room(change, self._contents, self._config)
        change = msgspec.structs.replace(change, seq=self._contents.seq + 1)
        self._journal.append(change)  # the durability point: acknowledged from here on
        try:
            self._contents.apply(change)
        except Exception:
            self._withdraw(change)
            raise
        self._periodic_snapshot()

    def _withdraw(self, change: Change) -> None:
        """A change that failed to apply is not acknowledged, so it must not replay either: its frame is cut
        (and its ``seq`` reused). Where the cut fails, the frame stays and its ``seq`` is used up, so no later
        change shares it (replay keeps one change per ``seq``)."""
        try:
            self._journal.retract()
        except OSError as err:
            self._contents.seq = change.seq
            logger.error("memory journal: change %d failed to apply and could not be withdrawn (%s); it will be "
                         "replayed at the next start", change.seq, err)

    def _periodic_snapshot(self) -> None:
        """Every ``snapshot_interval`` changes, start a snapshot in the background (one at a time).

        A failed snapshot never fails a write (each is already durable in the journal): it is logged and the
        next attempt waits (``durability.snapshot_retry_s``, doubling)."""
        self._note_snapshot_outcome()
        due = self._contents.seq - self._writer.durable_seq >= self._config.durability.snapshot_interval
        if not due or self._writer.is_busy:
            return
        now = self._clock()
        if now < self._snapshot_retry_at:
            return
        self._snapshot_started_at = now
        try:
            snapshot = self._contents.snapshot()
            self._journal.seal(snapshot.seq)
        except Exception as err:  # noqa: BLE001 - whatever failed, the acknowledged write stands
            self._snapshot_failed(err)
            return
        self._writer.start(snapshot)

    def _note_snapshot_outcome(self) -> None:
        """Log the background write's failure (and set the wait before the next), or reset the wait."""
        done: Future[Path] | None = self._writer.finished()
        if done is None:
            return
        if done.exception() is not None:
            self._snapshot_failed(done.exception())
            return
        self._snapshot_retry_at = -math.inf
        self._snapshot_backoff_s = self._config.durability.snapshot_retry_s

    def _snapshot_failed(self, err: BaseException) -> None:
        delay = self._snapshot_backoff_s
        self._snapshot_retry_at = self._snapshot_started_at + delay
        self._snapshot_backoff_s = min(2 * delay, self._config.durability.max_snapshot_retry_s)
        logger.warning("memory snapshot failed (%s: %s); the writes are durable in the journal, which keeps growing "
                       "until a snapshot succeeds; next try in %.0f s", type(err).__name__, err, delay)

    def _compact_after_damage(self, damaged: Sequence[Path]) -> None:
        """After damaged journal bytes or snapshot parts (copied aside): a snapshot now leaves clean files."""
        try:
            self.compact(damaged)
        except Exception as err:  # noqa: BLE001 - the store is whole in memory; the next start reads the same
            logger.warning("memory store: compacting after damage failed (%s: %s); the next start will skip the "
                           "damage again", type(err).__name__, err)
            return
        logger.warning("memory store: rewritten as a snapshot after damage; %d memories, %d Meta Plan pairs",
                       len(self._contents.entries), len(self._contents.meta_plans))

    def _plan_add(self, entry: MemoryEntry) -> tuple[AddResult, Change]:
        """The change ``add`` would make, without making it."""
        entry = validated_entry(entry, self._config, self._dim)
        if entry.id in self._contents.entries:
            raise InvalidMemory(f"a memory with id {entry.id!r} already exists")
        existing = self._contents.find_duplicate(entry, self._config.replace_threshold)
        if existing is None:
            return AddResult(entry.id, "inserted"), Change(0, put_entries=[entry])
        if should_replace(existing, entry):
            change = Change(0, put_entries=[entry], delete_entries=[existing.id])
            return AddResult(entry.id, "replaced", existing.id), change
        return AddResult(existing.id, "kept_existing"), Change(0)

    def _stamped(self, entry: MemoryEntry) -> MemoryEntry:
        now = self._clock()
        return msgspec.structs.replace(entry, created_at=now, updated_at=now)

    def _stamped_pair(self, pair: MetaPlanPair) -> MetaPlanPair:
        return msgspec.structs.replace(pair, created_at=self._clock())


def _default_score_fn() -> ScoreFn:
    """Imported lazily: the kernel module pulls in Triton where it is available."""
    from mia_kernels.memory_score import memory_topk

    return memory_topk
