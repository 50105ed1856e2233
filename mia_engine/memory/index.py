"""FAISS nearest-neighbour index over L2-normalised vectors, keyed by the store's string ids.

Used where the question is "which stored vector is closest" (duplicate replacement, Meta Plan
retrieval); the retrieval *score* runs over the bucket matrices instead (see ``buckets.py``).

Removal leaves a tombstone: the id leaves the maps at once, its row stays in FAISS until more than
``MAX_NUM_REMOVED_ROWS`` rows are dead, and then one compaction rewrites the index without them. A
clear, a trim or a replayed journal thus costs one pass over the index, not one per removed id, on
the CPU and on the GPU alike (GPU flat indexes have no ``remove_ids``, so compaction never uses it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

import faiss
import numpy as np

logger = logging.getLogger(__name__)

MAX_NUM_REMOVED_ROWS = 1024
"""Dead rows an index keeps before it compacts (per index): a search asks FAISS for k + this many
neighbours at most, within FAISS GPU's 2048-neighbour selection for every k <= 1024, and a compaction's
copy of the index is paid once per more than this many removals."""
GPU_TEMP_MEMORY_BYTES = 64 * 1024**2
"""FAISS's scratch arena on the index GPU (``StandardGpuResources.setTempMemory``), set explicitly so
the dry run budgets what is reserved (FAISS's default is 1.5 GiB on a GPU over 8 GiB); a one-query
search needs a few MiB of it and compaction reads the index back in chunks of half of it."""
GPU_MAX_SEARCH_K = 2048
"""The most neighbours one FAISS GPU search returns (its k-selection limit)."""


class GpuPlacement:
    """FAISS GPU resources and the GPU they belong to (``memory.index_device``): one per store, shared
    by all its indexes, with ``GPU_TEMP_MEMORY_BYTES`` of scratch on the GPU (and FAISS's default 256 MiB
    of pinned host memory for its copies, which is host RAM)."""

    def __init__(self, device: int) -> None:
        import torch

        self.device = device
        self.resources = faiss.StandardGpuResources()
        self.resources.setTempMemory(GPU_TEMP_MEMORY_BYTES)  # the arena is allocated at first use
        # FAISS's kernels go on the stream the store's thread is bound to (devices.bind_thread): the
        # serving priority, in order with the score kernel, instead of the GPU's shared default stream.
        stream = torch.cuda.current_stream(device)
        self.resources.setDefaultStream(device, faiss.cast_integer_to_cudastream_t(stream.cuda_stream))


def set_faiss_threads(num_threads: int = 0) -> int:
    """FAISS's OpenMP threads on the calling thread (``memory.faiss_threads``; 0 = the CPUs it may run on);
    the count set. OpenMP keeps the count per thread, so the store's thread calls this itself."""
    count = num_threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    faiss.omp_set_num_threads(count)
    logger.info("memory: FAISS searches use %d OpenMP thread%s (memory.faiss_threads = %d)",
                count, "" if count == 1 else "s", num_threads)
    return count


def gpu_resources(index_device: str = "cpu") -> GpuPlacement | None:
    """FAISS GPU resources on the configured GPU, or None for "cpu". Never probes the GPU otherwise:
    FAISS initialises CUDA outside torch, which vLLM cannot see when it decides fork vs spawn."""
    if index_device == "cpu":
        return None
    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    device = int(index_device.removeprefix("cuda:"))
    if get_num_gpus is None or get_num_gpus() <= device:
        raise RuntimeError(f"memory.index_device {index_device!r}: this FAISS build sees no such GPU (the "
                           "gpu extra installs faiss-cpu: set it to 'cpu', or install a faiss-gpu build for "
                           "torch's CUDA)")
    return GpuPlacement(device)


class VectorIndex:
    """Exact inner-product search with incremental add/remove (IndexIDMap2 over a flat IP index).

    FAISS wants int64 ids; the store's ids are strings, so each added id gets a fresh int64 key,
    increasing with insertion, and rows stay in insertion order (compaction keeps their order).
    """

    def __init__(self, dim: int, resources: GpuPlacement | None = None, *,
                 max_num_removed: int = MAX_NUM_REMOVED_ROWS) -> None:
        self._dim = dim
        self._resources = resources
        self._max_num_removed = max_num_removed
        self._index = self._new_index()
        self._key_of: dict[str, int] = {}
        self._id_of: dict[int, str] = {}
        self._removed: set[int] = set()  # keys of dead rows still in the FAISS index
        self._next_key = 0
        self._max_search_k = GPU_MAX_SEARCH_K if resources is not None else None

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._key_of

    @property
    def num_rows(self) -> int:
        """Rows FAISS holds: the live vectors plus at most ``max_num_removed`` dead ones."""
        return int(self._index.ntotal)

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
        self.remove_many((entry_id,))

    def remove_many(self, entry_ids: Iterable[str]) -> None:
        """Drop these ids (unknown ones are skipped); compacts at most once, when more than
        ``max_num_removed`` (default ``MAX_NUM_REMOVED_ROWS``) dead rows have piled up."""
        for entry_id in entry_ids:
            key = self._key_of.pop(entry_id, None)
            if key is not None:
                del self._id_of[key]
                self._removed.add(key)
        if len(self._removed) > self._max_num_removed:
            self.compact()

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k nearest ids with their inner products (cosines for normalised vectors), best first,
        equal similarities in insertion order (older first): the same answer whatever was removed."""
        k = min(k, len(self))
        if k <= 0:
            return []
        rows = _as_rows(vector, self._dim)
        num_asked = self._capped(k + len(self._removed))
        while True:
            sims, keys = self._index.search(rows, num_asked)  # (1, num_asked) each, best first
            hits = sorted(((sim, key) for sim, key in zip(sims[0].tolist(), keys[0].tolist()) if key in self._id_of),
                          key=lambda hit: (-hit[0], hit[1]))
            # FAISS picks arbitrarily among rows tied at its last place: ask for more until no row
            # tied with the k-th live hit can have been left out (on a GPU, within its 2048)
            is_complete = len(hits) >= k and sims[0][-1] < hits[k - 1][0]
            if is_complete or num_asked == self._capped(2 * num_asked):
                return [(self._id_of[key], sim) for sim, key in hits[:k]]
            num_asked = self._capped(2 * num_asked)

    def compact(self) -> None:
        """Rewrite the index without its dead rows (one pass, the same code on CPU and GPU); the old
        index is freed before the live rows are added back, so the GPU never holds both."""
        if not self._removed:
            return
        keys = faiss.vector_to_array(self._index.id_map).astype(np.int64)  # (n,) in row order
        is_live = ~np.isin(keys, np.fromiter(self._removed, dtype=np.int64, count=len(self._removed)))
        live_rows = self._live_rows(is_live)  # (num_live, d), on the host
        self._index = self._new_index()
        self._removed.clear()
        if len(live_rows):
            self._index.add_with_ids(live_rows, keys[is_live])

    def _live_rows(self, is_live: np.ndarray) -> np.ndarray:
        """The live vectors, read back in chunks: a GPU index copies each chunk through its scratch."""
        chunk = max(1, GPU_TEMP_MEMORY_BYTES // 2 // (4 * self._dim))
        out = np.empty((int(is_live.sum()), self._dim), dtype=np.float32)
        filled = 0
        for start in range(0, len(is_live), chunk):
            stop = min(start + chunk, len(is_live))
            kept = self._index.index.reconstruct_n(start, stop - start)[is_live[start:stop]]  # (m, d)
            out[filled:filled + len(kept)] = kept
            filled += len(kept)
        return out

    def _capped(self, num_asked: int) -> int:
        num_asked = min(num_asked, self.num_rows)
        return num_asked if self._max_search_k is None else min(num_asked, self._max_search_k)

    def _new_index(self) -> faiss.IndexIDMap2:
        if self._resources is None:
            flat = faiss.IndexFlatIP(self._dim)
        else:
            options = faiss.GpuIndexFlatConfig()
            options.device = self._resources.device
            flat = faiss.GpuIndexFlatIP(self._resources.resources, self._dim, options)
        return faiss.IndexIDMap2(flat)


def _as_rows(vector: np.ndarray, dim: int) -> np.ndarray:
    rows = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1, dim)  # (1, d)
    return rows
