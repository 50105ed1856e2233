"""Checks a record must pass before the journal sees it: replay of an accepted change must never fail."""

from __future__ import annotations

from .config import MemoryConfig
from .entries import BucketKey, InvalidMemory, MemoryEntry, MetaPlanPair, StoredRecord, vector_from_bytes


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
    vector_from_bytes(entry.question_embedding, dim)
    if entry.caption_embedding:
        vector_from_bytes(entry.caption_embedding, dim)
    return entry


def validated_pair(pair: MetaPlanPair, dim: int) -> MetaPlanPair:
    if not pair.id:
        raise InvalidMemory("meta plan id must not be empty")
    vector_from_bytes(pair.question_embedding, dim)
    return pair


def validated_record(record: StoredRecord, config: MemoryConfig, dim: int) -> StoredRecord:
    if isinstance(record, MemoryEntry):
        return validated_entry(record, config, dim)
    return validated_pair(record, dim)
