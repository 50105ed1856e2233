"""Request and response bodies of the ``/v1/memory`` routes (msgspec-validated, never raw dicts).

Responses leave embeddings out (they are for machines, and large); the JSONL export carries them.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ..memory.entries import MemoryCore, MemoryEntry, MemoryHit, Modality, NonEmptyStr, SearchResult
from ..memory.service import NewMemory

Count = Annotated[int, msgspec.Meta(ge=0, le=1000)]


AddRequest = NewMemory
"""POST /v1/memory/add: the service's own input type."""


class SearchRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """POST /v1/memory/search; counts default to ``MemoryConfig.num_positive``/``num_negative``."""

    question: NonEmptyStr
    caption: str | None = None
    category: str | None = None
    modality: Modality | None = None
    num_positive: Count | None = None
    num_negative: Count | None = None


class MemoryView(MemoryCore, frozen=True):
    """A memory as the API shows it: every field but the embeddings."""

    caption: str | None
    plan: str
    trajectory: str | None
    num_uses: int
    num_successes: int
    created_at: float
    updated_at: float
    object: Literal["memory"] = "memory"


class HitView(msgspec.Struct, frozen=True):
    """A retrieved memory and the terms of Score = λ_sim·sim_norm + λ_value·value + λ_freq·freq."""

    memory: MemoryView
    score: float
    sim: float
    sim_norm: float
    value: float
    freq: float


class SearchResponse(msgspec.Struct, frozen=True):
    bucket: str
    positives: list[HitView]
    negatives: list[HitView]


class DeleteResponse(msgspec.Struct, frozen=True):
    id: str
    deleted: bool = True
    object: Literal["memory.deleted"] = "memory.deleted"


class ImportResponse(msgspec.Struct, frozen=True):
    num_imported: int


def memory_view(entry: MemoryEntry) -> MemoryView:
    """The entry's value of each field of the view (all but its ``object`` tag, which keeps its default)."""
    return MemoryView(**{name: getattr(entry, name) for name in MemoryView.__struct_fields__ if name != "object"})


def search_response(result: SearchResult) -> SearchResponse:
    positives = [_hit_view(hit) for hit in result.positives]
    return SearchResponse(result.bucket, positives, [_hit_view(hit) for hit in result.negatives])


def _hit_view(hit: MemoryHit) -> HitView:
    return HitView(memory_view(hit.entry), hit.score, hit.sim, hit.sim_norm, hit.value, hit.freq)
