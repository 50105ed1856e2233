"""The typed records of the experience store: workflow memories, Meta Plan pairs, and results.

Entries are frozen: an update (counters, replacement) makes a new struct, so a reader holding an
entry (export, an HTTP response being encoded) never sees it change underneath.
"""

from __future__ import annotations

from typing import Annotated, Literal, NamedTuple

import msgspec
import numpy as np

Modality = Literal["text", "text_image"]
Label = Literal["correct", "incorrect"]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class MemoryStoreError(Exception):
    """Base of the store's own errors; the HTTP routes map them to 4xx bodies."""


class MemoryNotFound(MemoryStoreError, LookupError):
    """No memory (or Meta Plan pair) has this id."""


class InvalidMemory(MemoryStoreError, ValueError):
    """A memory or query the store cannot accept (unknown category, wrong embedding size, ...)."""


class RecordTooLarge(MemoryStoreError):
    """A change larger than the journal's record limit (``durability.max_record_bytes``): replay would
    refuse it, so it is refused before it is written (HTTP 413)."""


class MemoryUnavailable(MemoryStoreError):
    """The store is not open (still opening, or failed to open: the reason is in the log)."""


class BucketKey(NamedTuple):
    """Memories are only compared within a bucket: same modality and question category."""

    modality: Modality
    category: str

    def __str__(self) -> str:
        return f"{self.modality}/{self.category}"


class MemoryCore(msgspec.Struct, frozen=True):
    """The fields every workflow memory has, stored or shown: the base of the stored record (``MemoryEntry``)
    and of what the ``/v1/memory`` routes show (``server/memory_bodies.py: MemoryView``)."""

    id: str
    """Stable id (uuid4 hex); replacement makes a new id."""
    modality: Modality
    """"text_image" when the question came with an image (it then has a caption)."""
    category: str
    """Question category, one of ``MemoryConfig.categories``."""
    question: str
    """The question text."""
    workflow_summary: str
    """The Manager's compressed trajectory: numbered "**action purpose** (input → output)" steps."""
    label: Label
    """The judge's verdict on the trajectory: a positive or a negative example."""


class MemoryEntry(MemoryCore, frozen=True, forbid_unknown_fields=True, tag="entry", tag_field="kind"):
    """One workflow memory: what was asked, how it was solved (or failed), and how useful it was."""

    caption: str | None = None
    """The Manager's caption of the question image, if any."""
    plan: str = ""
    """The Planner's plan that produced the trajectory."""
    trajectory: str | None = None
    """The Executor's full trajectory, kept for inspection and re-summarising."""
    num_uses: int = 0
    """u: how many answered queries retrieved this memory."""
    num_successes: int = 0
    """s: how many of those queries ended correct."""
    created_at: float = 0.0
    """Unix time of insertion (replacement counts as insertion)."""
    updated_at: float = 0.0
    """Unix time of the last change (counters included)."""
    question_embedding: bytes = b""
    """e(question): little-endian float32, L2-normalised; empty only in an import to re-embed."""
    caption_embedding: bytes = b""
    """e(caption): same layout; empty when there is no caption."""

    @property
    def bucket(self) -> BucketKey:
        return BucketKey(self.modality, self.category)

    @property
    def is_correct(self) -> bool:
        return self.label == "correct"


class MetaPlanPair(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="meta_plan", tag_field="kind"):
    """A contrastive example for the Router: for one past question, a plan that worked and one that did not."""

    id: str
    """Stable id (uuid4 hex)."""
    question: str
    """The past question both plans were written for."""
    successful_plan: str
    """A plan whose rollout was judged correct."""
    failed_plan: str
    """A plan whose rollout was judged incorrect."""
    created_at: float = 0.0
    """Unix time of insertion."""
    question_embedding: bytes = b""
    """e(question), little-endian float32; empty only in an import to re-embed."""


StoredRecord = MemoryEntry | MetaPlanPair
"""What an export line holds (tagged by ``kind``)."""


class SummarisedRollout(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One of a question's G test-time rollouts reduced to what consolidation reads and stores: the memory
    side's view of the research loop's ``agent.records.Rollout``, built by the loop once the Manager has
    summarised it (``agent/loop.py: summarised``).

    The memory cannot take the agent's struct: it sits a layer below the agent (``scripts/layers.py``), and
    that struct holds what the store never keeps (Executor turns and observations, verdicts, rewards,
    timings) while lacking the one thing it does keep, the Manager's workflow summary."""

    plan: str
    """The plan the Executor followed."""
    workflow_summary: str
    """The Manager's summary of the trajectory."""
    is_correct: bool
    """The judge's verdict."""
    length: int
    """Trajectory length (the loop gives Executor turns); the shortest success becomes the positive memory."""
    trajectory: str | None = None
    """The full trajectory, stored with the memory when given."""


class MemoryHit(msgspec.Struct, frozen=True):
    """A retrieved memory with the terms of its score, so callers can log why it was chosen."""

    entry: MemoryEntry
    score: float
    sim: float
    sim_norm: float
    value: float
    freq: float


class SearchResult(msgspec.Struct, frozen=True):
    """Top positives and negatives of one query's bucket, best first."""

    bucket: str
    positives: list[MemoryHit]
    negatives: list[MemoryHit]


class MetaPlanHit(msgspec.Struct, frozen=True):
    """A Meta Plan pair and the cosine of its question to the query."""

    pair: MetaPlanPair
    similarity: float


AddAction = Literal["inserted", "replaced", "kept_existing"]


class AddResult(msgspec.Struct, frozen=True):
    """What ``add`` did: a kept existing memory means the new one was a duplicate that lost."""

    id: str
    """The id now holding the memory (the existing one when ``kept_existing``)."""
    action: AddAction
    replaced_id: str | None = None


class ConsolidationResult(msgspec.Struct, frozen=True):
    """What one question's rollouts added to memory."""

    positive: AddResult | None = None
    negative: AddResult | None = None
    meta_plan_id: str | None = None


class ClearResult(msgspec.Struct, frozen=True):
    """What a selective clearing removed."""

    removed_ids: list[str]
    removed_meta_plan_ids: list[str]


class BucketStats(msgspec.Struct, frozen=True):
    num_positive: int
    num_negative: int


class MemoryStats(msgspec.Struct, frozen=True):
    """A cheap summary for dashboards and tests."""

    num_entries: int
    num_meta_plans: int
    buckets: dict[str, BucketStats]
    dim: int
    journal_seq: int
    """Sequence number of the last durable change."""
    num_records_since_snapshot: int


def vector_to_bytes(vector: np.ndarray) -> bytes:
    """float32 little-endian: exact, compact in msgpack, base64 in JSON."""
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def vector_from_bytes(data: bytes, dim: int) -> np.ndarray:
    """(dim,) float32; raises InvalidMemory on a size that does not match the store's encoder."""
    if len(data) != 4 * dim:
        raise InvalidMemory(f"embedding has {len(data) // 4} floats, the store's encoder gives {dim}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)
