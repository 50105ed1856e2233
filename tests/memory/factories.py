"""Builders for store-level tests: entries with given embeddings, so no encoder is needed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from mia_engine.config.memory import DurabilityConfig, MemoryConfig
from mia_engine.memory.entries import Label, MemoryEntry, Modality, vector_to_bytes
from mia_engine.memory.store import ExperienceStore

DIM = 8
StoreOpener = Callable[..., ExperienceStore]


class FakeClock:
    """A clock the test advances by hand, so timestamps and clearing ages are exact."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def unit(rng: np.random.Generator, dim: int = DIM) -> np.ndarray:
    vector = rng.standard_normal(dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


def make_entry(
    key_q: np.ndarray,
    *,
    label: Label = "correct",
    question: str = "q",
    summary: str = "1. **search** (q → a)",
    key_c: np.ndarray | None = None,
    caption: str | None = None,
    category: str = "others",
    modality: Modality | None = None,
    **fields: object,
) -> MemoryEntry:
    has_caption = key_c is not None
    return MemoryEntry(
        id=uuid.uuid4().hex,
        modality=modality or ("text_image" if has_caption else "text"),
        category=category,
        question=question,
        workflow_summary=summary,
        label=label,
        caption=caption if caption is not None else ("a caption" if has_caption else None),
        question_embedding=vector_to_bytes(key_q),
        caption_embedding=vector_to_bytes(key_c) if has_caption else b"",
        **fields,
    )


def memory_config(snapshot_interval: int = 1000, **fields: object) -> MemoryConfig:
    return MemoryConfig(durability=DurabilityConfig(snapshot_interval=snapshot_interval), **fields)


def open_store(path: Path, config: MemoryConfig | None = None, *, clock: FakeClock | None = None) -> ExperienceStore:
    return ExperienceStore.open(path, config or memory_config(), DIM, clock=clock or FakeClock())


def state_of(store: ExperienceStore) -> list[bytes]:
    """Every stored record, encoded and sorted: equal lists mean identical stores."""
    return sorted(msgspec.json.encode(record) for record in store.export_records())
