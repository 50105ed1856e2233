"""Meta Plan Memory: contrastive (successful plan, failed plan) pairs the Router reads.

Retrieval is plain cosine over past questions (no buckets, no counters): the Router only needs
"how did plans for questions like this one go".
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .entries import MetaPlanHit, MetaPlanPair, vector_from_bytes
from .index import GpuPlacement, VectorIndex


class MetaPlanMemory:
    """In-memory state of the pairs; durability is the store's job."""

    def __init__(self, dim: int, faiss_resources: GpuPlacement | None = None) -> None:
        self._dim = dim
        self._pairs: dict[str, MetaPlanPair] = {}  # insertion order = age order
        self._index = VectorIndex(dim, faiss_resources)

    def __len__(self) -> int:
        return len(self._pairs)

    def __contains__(self, pair_id: str) -> bool:
        return pair_id in self._pairs

    def pairs(self) -> list[MetaPlanPair]:
        return list(self._pairs.values())

    def put(self, pair: MetaPlanPair) -> None:
        """Insert or overwrite (an import may bring a pair the store already has)."""
        self.remove(pair.id)
        self._pairs[pair.id] = pair
        self._index.add(pair.id, vector_from_bytes(pair.question_embedding, self._dim))

    def remove(self, pair_id: str) -> None:
        self.remove_many((pair_id,))

    def remove_many(self, pair_ids: Iterable[str]) -> None:
        """Drop these pairs (unknown ids are skipped) with one index call: one compaction at most."""
        self._index.remove_many([pair_id for pair_id in pair_ids if self._pairs.pop(pair_id, None) is not None])

    def search(self, query: np.ndarray, k: int) -> list[MetaPlanHit]:
        return [MetaPlanHit(self._pairs[pair_id], sim) for pair_id, sim in self._index.search(query, k)]

    def oldest_beyond(self, capacity: int) -> list[str]:
        """Ids to drop so that at most ``capacity`` pairs remain (0 = unlimited)."""
        if capacity <= 0 or len(self._pairs) <= capacity:
            return []
        by_age = sorted(self._pairs.values(), key=lambda pair: pair.created_at)
        return [pair.id for pair in by_age[: len(self._pairs) - capacity]]
