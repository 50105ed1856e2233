"""Checks a record must pass before the journal sees it: replay of an accepted change must never fail."""

from __future__ import annotations

import math

import numpy as np

from ..config.memory import MemoryConfig, TextLimits
from .entries import BucketKey, InvalidMemory, MemoryEntry, MetaPlanPair, StoredRecord, vector_from_bytes

UNIT_NORM_TOLERANCE = 1e-3
"""|‖e‖ − 1| above this is not an encoder's output: one NaN or unnormalised key would poison every
score of its bucket (min-max normalisation spans the bucket)."""


_TEXT_LIMITS: dict[str, str] = {
    "id": "max_id_chars",
    "question": "max_question_chars",
    "caption": "max_caption_chars",
    "workflow_summary": "max_summary_chars",
    "plan": "max_plan_chars",
    "successful_plan": "max_plan_chars",
    "failed_plan": "max_plan_chars",
    "trajectory": "max_trajectory_chars",
}
"""Each text field of a memory, a Meta Plan pair or a query, and the ``TextLimits`` field that caps it."""


class TextTooLong(InvalidMemory):
    """A text field over its ``memory.text_limits`` cap; ``field`` names it (the HTTP error's ``param``)."""

    def __init__(self, field: str, length: int, limit_name: str, limit: int) -> None:
        super().__init__(f"{field} is {length} characters long; the limit is {limit} "
                         f"(memory.text_limits.{limit_name})")
        self.field = field


def check_text_lengths(limits: TextLimits, **texts: str | None) -> None:
    """Refuse the first text over its cap; the keywords are field names of ``_TEXT_LIMITS``."""
    for field, text in texts.items():
        limit_name = _TEXT_LIMITS[field]
        limit = getattr(limits, limit_name)
        if text is not None and len(text) > limit:
            raise TextTooLong(field, len(text), limit_name, limit)


def check_record_texts(limits: TextLimits, record: StoredRecord) -> None:
    """``check_text_lengths`` of every text field of a stored record."""
    check_text_lengths(limits, **{field: getattr(record, field) for field in _TEXT_LIMITS if hasattr(record, field)})


def bucket_key(config: MemoryConfig, modality: str, category: str | None) -> BucketKey:
    """Validated bucket of a query or memory; a missing category is the configured default."""
    if modality not in ("text", "text_image"):
        raise InvalidMemory(f"modality must be 'text' or 'text_image', got {modality!r}")
    category = category or config.default_category
    if category not in config.categories:
        raise InvalidMemory(f"unknown category {category[:64]!r}; expected one of {list(config.categories)}")
    return BucketKey(modality, category)  # type: ignore[arg-type]


def validated_entry(entry: MemoryEntry, config: MemoryConfig, dim: int) -> MemoryEntry:
    """Structs built in Python skip msgspec's type checks, so the store checks what it relies on."""
    if not entry.id:
        raise InvalidMemory("memory id must not be empty")
    check_record_texts(config.text_limits, entry)
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


def validated_pair(pair: MetaPlanPair, config: MemoryConfig, dim: int) -> MetaPlanPair:
    if not pair.id:
        raise InvalidMemory("meta plan id must not be empty")
    check_record_texts(config.text_limits, pair)
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
    return validated_pair(record, config, dim)
