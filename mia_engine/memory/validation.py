"""Checks a record must pass before the journal sees it: replay of an accepted change must never fail."""

from __future__ import annotations

import math

import numpy as np

from .config import MemoryConfig
from .entries import BucketKey, InvalidMemory, MemoryEntry, MetaPlanPair, StoredRecord, vector_from_bytes

UNIT_NORM_TOLERANCE = 1e-3
"""|‖e‖ − 1| above this is not an encoder's output: one NaN or unnormalised key would poison every
score of its bucket (min-max normalisation spans the bucket)."""


def bucket_key(config: MemoryConfig, modality: str, category: str | None) -> BucketKey:
    """Validated bucket of a query or memory; a missing category is the configured default."""
    if modality not in ("text", "text_image"):
        raise InvalidMemory(f"modality must be 'text' or 'text_image', got {modality!r}")
    category = category or config.default_category
    if category not in config.categories:
        raise InvalidMemory(f"unknown category {category!r}; expected one of {list(config.categories)}")
    return BucketKey(modality, category)  # type: ignore[arg-type]


def validated_entry(entry: MemoryEntry, config: MemoryConfig, dim: int) -> MemoryEntry:
    """Structs built in Python skip msgspec's type checks, so the store checks what it relies on."""
    if not entry.id:
        raise InvalidMemory("memory id must not be empty")
    if entry.label not in ("correct", "incorrect"):
        raise InvalidMemory(f"label must be 'correct' or 'incorrect', got {entry.label!r}")
    if not entry.category:
        raise InvalidMemory("category must not be empty")
    bucket_key(config, entry.modality, entry.category)
    if entry.num_uses < 0 or entry.num_successes < 0:
        raise InvalidMemory("num_uses and num_successes must be >= 0")
    if entry.num_successes > entry.num_uses:
        raise InvalidMemory(f"num_successes ({entry.num_successes}) must not exceed num_uses ({entry.num_uses})")
    _check_times(entry.created_at, entry.updated_at)
    unit_vector(entry.question_embedding, dim, "question_embedding")
    if entry.caption_embedding:
        unit_vector(entry.caption_embedding, dim, "caption_embedding")
    return entry


def validated_pair(pair: MetaPlanPair, dim: int) -> MetaPlanPair:
    if not pair.id:
        raise InvalidMemory("meta plan id must not be empty")
    _check_times(pair.created_at)
    unit_vector(pair.question_embedding, dim, "question_embedding")
    return pair


def unit_vector(data: bytes, dim: int, name: str) -> np.ndarray:
    """(dim,) float32 key, refused unless finite and L2-normalised."""
    vector = vector_from_bytes(data, dim)
    if not np.isfinite(vector).all():
        raise InvalidMemory(f"{name} has non-finite values")
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if abs(norm - 1.0) > UNIT_NORM_TOLERANCE:
        raise InvalidMemory(f"{name} is not L2-normalised (norm {norm:.4g})")
    return vector


def _check_times(*times: float) -> None:
    if not all(math.isfinite(t) for t in times):
        raise InvalidMemory("timestamps must be finite")


def validated_record(record: StoredRecord, config: MemoryConfig, dim: int) -> StoredRecord:
    if isinstance(record, MemoryEntry):
        return validated_entry(record, config, dim)
    return validated_pair(record, dim)
