"""MemoryService: the async face of the Memory Manager's experience store.

The research loop and the HTTP routes both talk to this class. It embeds text on the encoder's
thread and runs every store call on one store thread, so the event loop never blocks on a
forward pass, a FAISS search or an fsync, and concurrent writes are serialised in arrival order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import msgspec
import numpy as np

from ..base.coalesce import Coalescer
from ..devices import thread_binder
from .buckets import ScoreFn
from ..config.memory import MemoryConfig
from .consolidation import should_store_meta_plan
from .embedder import Embedder, TextEncoder
from .entries import (
    AddResult,
    BucketKey,
    ClearResult,
    ConsolidationResult,
    Label,
    MemoryEntry,
    MemoryStats,
    MetaPlanHit,
    MetaPlanPair,
    Modality,
    NonEmptyStr,
    SearchResult,
    StoredRecord,
    SummarisedRollout,
    vector_to_bytes,
)
from .retrieval import SearchQuery
from .store import ExperienceStore
from .store_devices import store_device
from .validation import check_record_texts, check_text_lengths

T = TypeVar("T")


class NewMemory(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A memory to store; the service adds id, embeddings, counters and times."""

    question: NonEmptyStr
    """The question text."""
    workflow_summary: NonEmptyStr
    """The Manager's workflow summary of the trajectory."""
    label: Label
    """The judge's verdict on the trajectory."""
    caption: str | None = None
    """Caption of the question image, if any."""
    category: str | None = None
    """Question category; None = ``MemoryConfig.default_category``."""
    modality: Modality | None = None
    """None = "text_image" when there is a caption, else "text"."""
    plan: str = ""
    """The plan that produced the trajectory."""
    trajectory: str | None = None
    """The full trajectory."""


class MemoryService:
    """Async API over one ``ExperienceStore`` and one encoder. Build it with ``MemoryService.open``."""

    def __init__(
        self,
        store: ExperienceStore,
        encoder: TextEncoder,
        config: MemoryConfig,
        executor: ThreadPoolExecutor,
        *,
        owns_encoder: bool,
    ) -> None:
        self._store = store
        self._encoder = encoder
        self._config = config
        self._executor = executor
        self._owns_encoder = owns_encoder
        self._is_closed = False
        self._searches = Coalescer(partial(self._run, store.search_many), max_batch=config.search_batch_size,
                                   name="the memory store's search worker")
        """Concurrent searches scored together (``MemoryConfig.search_batch_size``)."""

    @classmethod
    async def open(
        cls,
        data_dir: str | Path,
        config: MemoryConfig | None = None,
        *,
        encoder: TextEncoder | None = None,
        score_fn: ScoreFn | None = None,
        clock: Callable[[], float] = time.time,
    ) -> MemoryService:
        """Load the encoder (unless one is shared in) and restore the store under ``data_dir``."""
        config = config or MemoryConfig()
        loop = asyncio.get_running_loop()
        owns_encoder = encoder is None
        if encoder is None:
            encoder = await loop.run_in_executor(None, Embedder, config.embedder)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-store",
                                      initializer=thread_binder(store_device(config), "serving"))
        opener = partial(ExperienceStore.open, data_dir, config, encoder.dim, clock=clock, score_fn=score_fn)
        try:
            store = await loop.run_in_executor(executor, opener)
        except BaseException:
            executor.shutdown()
            if owns_encoder:
                encoder.close()
            raise
        return cls(store, encoder, config, executor, owns_encoder=owns_encoder)

    @property
    def config(self) -> MemoryConfig:
        return self._config

    # ---- workflow memory -----------------------------------------------------------------

    async def add(self, memory: NewMemory) -> AddResult:
        """Store one memory (or replace its duplicate); durable when this returns."""
        check_text_lengths(self._config.text_limits, question=memory.question, caption=memory.caption,
                           workflow_summary=memory.workflow_summary, plan=memory.plan, trajectory=memory.trajectory)
        bucket = self._bucket(memory.modality, memory.caption, memory.category)
        key_q, key_c = await self._embed(memory.question, memory.caption)
        entry = _entry(memory, bucket, key_q, key_c)
        return await self._run(self._store.add, entry)

    async def search(
        self,
        question: str,
        *,
        caption: str | None = None,
        category: str | None = None,
        modality: Modality | None = None,
        num_positive: int | None = None,
        num_negative: int | None = None,
    ) -> SearchResult:
        """Top positives and negatives of the query's bucket, each with its score terms."""
        check_text_lengths(self._config.text_limits, question=question, caption=caption)
        bucket = self._bucket(modality, caption, category)
        query_q, query_c = await self._embed(question, caption)
        if self._is_closed:
            raise RuntimeError("the memory service is closed")
        return await self._searches.submit(SearchQuery(
            query_q,
            query_c,
            bucket,
            self._config.num_positive if num_positive is None else num_positive,
            self._config.num_negative if num_negative is None else num_negative,
        ))

    async def get(self, entry_id: str) -> MemoryEntry:
        return await self._run(self._store.get, entry_id)

    async def delete(self, entry_id: str) -> None:
        await self._run(self._store.delete, entry_id)

    async def record_outcome(self, used_ids: Iterable[str], success: bool) -> int:
        """Count one query's use of its retrieved memories (u += 1, s += 1 on success)."""
        return await self._run(self._store.record_outcome, list(used_ids), success)

    async def consolidate_group(
        self,
        question: str,
        chosen: tuple[SummarisedRollout | None, SummarisedRollout | None],
        *,
        caption: str | None = None,
        category: str | None = None,
        modality: Modality | None = None,
    ) -> ConsolidationResult:
        """TTL step 6 for the (success, failure) the loop chose (``consolidation.choose_rollouts``; either may
        be None): the success → a positive memory, the failure → a negative one, both → a Meta Plan pair."""
        positive, negative = chosen
        if (positive is not None and not positive.is_correct) or (negative is not None and negative.is_correct):
            raise ValueError("consolidate_group takes (a successful rollout, a failed rollout), in that order")
        if positive is None and negative is None:
            return ConsolidationResult()
        bucket = self._bucket(modality, caption, category)
        key_q, key_c = await self._embed(question, caption)
        entries = [
            None if rollout is None else _entry(_from_rollout(question, caption, rollout), bucket, key_q, key_c)
            for rollout in (positive, negative)
        ]
        pair = None
        if should_store_meta_plan(positive, negative):
            pair = _meta_plan_pair(question, positive.plan, negative.plan, key_q)
        return await self._run(self._store.consolidate, entries[0], entries[1], pair)

    async def clear_after_update(self) -> ClearResult:
        """Run after each learning update: the configured selective clearing."""
        return await self._run(self._store.clear_after_update)

    # ---- Meta Plan Memory ----------------------------------------------------------------

    async def add_meta_plan(self, question: str, successful_plan: str, failed_plan: str) -> MetaPlanPair:
        check_text_lengths(self._config.text_limits, question=question, successful_plan=successful_plan,
                           failed_plan=failed_plan)
        key_q, _ = await self._embed(question, None)
        pair = _meta_plan_pair(question, successful_plan, failed_plan, key_q)
        return await self._run(self._store.add_meta_plan, pair)

    async def search_meta_plans(self, question: str, k: int | None = None) -> list[MetaPlanHit]:
        """Pairs of the ``k`` most similar past questions, for the Router's prompt."""
        check_text_lengths(self._config.text_limits, question=question)
        key_q, _ = await self._embed(question, None)
        return await self._run(self._store.search_meta_plans, key_q, self._config.num_meta_plans if k is None else k)

    async def delete_meta_plan(self, pair_id: str) -> None:
        await self._run(self._store.delete_meta_plan, pair_id)

    # ---- bulk, housekeeping --------------------------------------------------------------

    async def export_records(self) -> list[StoredRecord]:
        """Every memory and pair; the list is a consistent cut (later writes do not show up in it)."""
        return await self._run(self._store.export_records)

    async def import_records(self, records: Sequence[StoredRecord]) -> int:
        """Upsert exported records verbatim; records with empty embeddings are embedded first (their texts
        checked before, so no over-long text reaches the encoder)."""
        for record in records:
            check_record_texts(self._config.text_limits, record)
        return await self._run(self._store.import_records, await self._with_embeddings(records))

    async def stats(self) -> MemoryStats:
        return await self._run(self._store.stats)

    async def compact(self) -> None:
        """Snapshot now (e.g. before a planned shutdown, so the next start replays nothing)."""
        await self._run(self._store.compact)

    async def close(self) -> None:
        """Release files and threads; idempotent, so owners can close unconditionally."""
        if self._is_closed:
            return
        self._is_closed = True
        self._searches.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._store.close)
        self._executor.shutdown()
        if self._owns_encoder:
            await asyncio.get_running_loop().run_in_executor(None, self._encoder.close)

    # ---- helpers -------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        if self._is_closed:
            raise RuntimeError("the memory service is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def _embed(self, question: str, caption: str | None) -> tuple[np.ndarray, np.ndarray | None]:
        """(d,) question key and (d,) caption key (None without a caption), in one encoder call."""
        vectors = await self._encoder.encode_async([question, caption] if caption else [question])
        return vectors[0], (vectors[1] if caption else None)

    def _bucket(self, modality: Modality | None, caption: str | None, category: str | None) -> BucketKey:
        return self._store.bucket_key(modality or ("text_image" if caption else "text"), category)

    async def _with_embeddings(self, records: Sequence[StoredRecord]) -> list[StoredRecord]:
        """Fill empty embeddings with one batched encoder call."""
        texts: list[str] = []
        for record in records:
            if not record.question_embedding:
                texts.append(record.question)
            if isinstance(record, MemoryEntry) and record.caption and not record.caption_embedding:
                texts.append(record.caption)
        vectors = iter(await self._encoder.encode_async(texts)) if texts else iter(())
        return [_filled(record, vectors) for record in records]


def _entry(memory: NewMemory, bucket: BucketKey, key_q: np.ndarray, key_c: np.ndarray | None) -> MemoryEntry:
    return MemoryEntry(
        id=uuid.uuid4().hex,
        modality=bucket.modality,
        category=bucket.category,
        question=memory.question,
        workflow_summary=memory.workflow_summary,
        label=memory.label,
        caption=memory.caption,
        plan=memory.plan,
        trajectory=memory.trajectory,
        question_embedding=vector_to_bytes(key_q),
        caption_embedding=b"" if key_c is None else vector_to_bytes(key_c),
    )


def _meta_plan_pair(question: str, successful_plan: str, failed_plan: str, key_q: np.ndarray) -> MetaPlanPair:
    embedding = vector_to_bytes(key_q)
    return MetaPlanPair(uuid.uuid4().hex, question, successful_plan, failed_plan, question_embedding=embedding)


def _from_rollout(question: str, caption: str | None, rollout: SummarisedRollout) -> NewMemory:
    return NewMemory(
        question=question,
        workflow_summary=rollout.workflow_summary,
        label="correct" if rollout.is_correct else "incorrect",
        caption=caption,
        plan=rollout.plan,
        trajectory=rollout.trajectory,
    )


def _filled(record: StoredRecord, vectors: Iterable[np.ndarray]) -> StoredRecord:
    """Same order as ``_with_embeddings`` collected the texts."""
    vectors = iter(vectors)
    changes: dict[str, bytes] = {}
    if not record.question_embedding:
        changes["question_embedding"] = vector_to_bytes(next(vectors))
    if isinstance(record, MemoryEntry) and record.caption and not record.caption_embedding:
        changes["caption_embedding"] = vector_to_bytes(next(vectors))
    return msgspec.structs.replace(record, **changes) if changes else record
