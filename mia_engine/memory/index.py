"""FAISS nearest-neighbour index over L2-normalised vectors, keyed by the store's string ids.

Used where the question is "which stored vector is closest" (duplicate replacement, Meta Plan
retrieval); the retrieval *score* runs over the bucket matrices instead (see ``buckets.py``).
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np


class GpuPlacement:
    """FAISS GPU resources and the GPU they belong to (``memory.index_device``)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.resources = faiss.StandardGpuResources()


def gpu_resources(index_device: str = "cpu") -> GpuPlacement | None:
    """FAISS GPU resources on the configured GPU, or None for "cpu". Never probes the GPU otherwise:
    FAISS initialises CUDA outside torch, which vLLM cannot see when it decides fork vs spawn."""
    if index_device == "cpu":
        return None
    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    device = int(index_device.removeprefix("cuda:"))
    if get_num_gpus is None or get_num_gpus() <= device:
        raise RuntimeError(f"memory.index_device {index_device!r}: this FAISS build sees no such GPU "
                           "(install faiss-gpu, or set it to 'cpu')")
    return GpuPlacement(device)


class VectorIndex:
    """Exact inner-product search with incremental add/remove (IndexIDMap2 over a flat IP index).

    FAISS wants int64 ids; the store's ids are strings, so each added id gets a fresh int64 key.
    """

    def __init__(self, dim: int, resources: Any | None = None) -> None:
        self._dim = dim
        self._resources = resources
        self._index = self._new_index()
        self._key_of: dict[str, int] = {}
        self._id_of: dict[int, str] = {}
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._key_of

    def add(self, entry_id: str, vector: np.ndarray) -> None:
        """Add (or overwrite) one vector of shape (d,)."""
        if entry_id in self._key_of:
            self.remove(entry_id)
        key = self._next_key
        self._next_key += 1
        self._index.add_with_ids(_as_rows(vector, self._dim), np.array([key], dtype=np.int64))
        self._key_of[entry_id] = key
        self._id_of[key] = entry_id

    def remove(self, entry_id: str) -> None:
        key = self._key_of.pop(entry_id, None)
        if key is None:
            return
        del self._id_of[key]
        try:
            self._index.remove_ids(np.array([key], dtype=np.int64))
        except RuntimeError:  # GPU flat indexes cannot remove in place
            self._rebuild_without(key)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k nearest ids with their inner products (cosines for normalised vectors), best first."""
        k = min(k, len(self))
        if k <= 0:
            return []
        sims, keys = self._index.search(_as_rows(vector, self._dim), k)  # (1, k) each
        return [(self._id_of[int(key)], float(sim)) for sim, key in zip(sims[0], keys[0]) if key >= 0]

    def _new_index(self) -> faiss.IndexIDMap2:
        if self._resources is None:
            flat = faiss.IndexFlatIP(self._dim)
        else:
            options = faiss.GpuIndexFlatConfig()
            options.device = self._resources.device
            flat = faiss.GpuIndexFlatIP(self._resources.resources, self._dim, options)
        return faiss.IndexIDMap2(flat)

    def _rebuild_without(self, key: int) -> None:
        """Slow path for indexes without remove_ids: re-add every vector but one."""
        keys = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        vectors = self._index.index.reconstruct_n(0, self._index.ntotal)  # (n, d)
        is_kept = keys != key
        self._index = self._new_index()
        if is_kept.any():
            self._index.add_with_ids(vectors[is_kept], keys[is_kept])


def _as_rows(vector: np.ndarray, dim: int) -> np.ndarray:
    rows = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1, dim)  # (1, d)
    return rows
