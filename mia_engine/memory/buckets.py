"""One retrieval bucket: the contiguous key matrices the score kernel reads, kept up to date in place.

The score needs the whole bucket (min-max over every entry), so the keys live in dense (N, d)
tensors that grow by doubling and shrink by moving the last row into the hole: adding or
removing a memory is O(d), a query never rebuilds anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, NamedTuple

import numpy as np
import torch

from ..config.memory import ScoreWeights
from .index import GpuPlacement, VectorIndex

ScoreFn = Callable[..., object]
"""``mia_kernels.memory_score.memory_topk`` or anything with its contract."""

_INITIAL_CAPACITY = 16


class ScoredRow(NamedTuple):
    """One ranked memory of a bucket, with the terms of its score."""

    entry_id: str
    score: float
    sim: float
    sim_norm: float
    value: float
    freq: float


class Bucket:
    """Key matrices (for the score) plus one FAISS index per label (for duplicate lookup)."""

    def __init__(self, dim: int, device: torch.device, faiss_resources: GpuPlacement | None = None) -> None:
        self._dim = dim
        self._device = device
        self._ids: list[str] = []
        self._row_of: dict[str, int] = {}
        self._keys_q = torch.zeros((_INITIAL_CAPACITY, dim), dtype=torch.float32, device=device)
        self._keys_c = torch.zeros_like(self._keys_q)
        self._usage = torch.zeros(_INITIAL_CAPACITY, dtype=torch.float32, device=device)
        self._success = torch.zeros_like(self._usage)
        self._labels = torch.zeros(_INITIAL_CAPACITY, dtype=torch.int8, device=device)
        self._by_label = {True: VectorIndex(dim, faiss_resources), False: VectorIndex(dim, faiss_resources)}

    def __len__(self) -> int:
        return len(self._ids)

    def count(self, is_correct: bool) -> int:
        return len(self._by_label[is_correct])

    def add(
        self,
        entry_id: str,
        is_correct: bool,
        key_q: np.ndarray,
        key_c: np.ndarray | None,
        counts: tuple[int, int],
    ) -> None:
        """Append one memory; ``counts`` is (u, s). The id must not be in the bucket yet."""
        if len(self._ids) == self._keys_q.shape[0]:
            self._grow()
        row = len(self._ids)
        self._keys_q[row] = torch.from_numpy(key_q)
        self._keys_c[row] = torch.from_numpy(key_c) if key_c is not None else 0.0
        self._usage[row], self._success[row] = float(counts[0]), float(counts[1])
        self._labels[row] = int(is_correct)
        self._ids.append(entry_id)
        self._row_of[entry_id] = row
        self._by_label[is_correct].add(entry_id, key_q)

    def remove_many(self, entry_ids: Sequence[str]) -> None:
        """Drop these memories (all in the bucket). Each removal moves the last row into its hole, so
        the matrices stay dense; the moves are worked out on row numbers first, then made with one
        indexed copy per matrix, and each FAISS index gets one call (one compaction at most)."""
        sources: dict[int, int] = {}  # row -> the row whose contents it takes
        for entry_id in entry_ids:
            row = self._row_of.pop(entry_id)
            last = len(self._ids) - 1
            source = sources.pop(last, last)
            if row != last:  # fill the hole with the last row
                moved = self._ids[last]
                self._ids[row], self._row_of[moved], sources[row] = moved, row, source
            self._ids.pop()
        self._copy_rows(sources)
        for index in self._by_label.values():
            index.remove_many(entry_ids)

    def _copy_rows(self, sources: dict[int, int]) -> None:
        """Row r of every matrix takes the contents row ``sources[r]`` had (a gather, then a scatter)."""
        if not sources:
            return
        dst = torch.tensor(list(sources), device=self._device)
        src = torch.tensor(list(sources.values()), device=self._device)
        for tensor in (self._keys_q, self._keys_c, self._usage, self._success, self._labels):
            tensor[dst] = tensor[src]

    def set_counts(self, entry_id: str, num_uses: int, num_successes: int) -> None:
        row = self._row_of[entry_id]
        self._usage[row] = float(num_uses)
        self._success[row] = float(num_successes)

    def nearest(self, is_correct: bool, key_q: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Same-label neighbours of a question key: the candidates for duplicate replacement."""
        return self._by_label[is_correct].search(key_q, k)

    def top_k(
        self,
        queries_q: np.ndarray,
        queries_c: Sequence[np.ndarray | None],
        k: int,
        weights: ScoreWeights,
        score_fn: ScoreFn,
        backend: str,
    ) -> list[tuple[list[ScoredRow], list[ScoredRow]]]:
        """Best ``k`` positives and negatives by the paper's score, over the live rows, for each of B
        queries (``queries_q`` (B, d); ``queries_c`` B caption keys or None) in one kernel call: the
        call streams the whole key matrix, so B queries together read it once instead of B times."""
        num_rows, batch = len(self._ids), len(queries_c)
        if num_rows == 0 or k <= 0 or batch == 0:
            return [([], []) for _ in range(batch)]
        q = torch.from_numpy(np.asarray(queries_q, dtype=np.float32)).to(self._device).reshape(batch, -1)  # (B, d)
        has_caption = [c is not None for c in queries_c]
        c = mask = None
        if any(has_caption):
            zeros = np.zeros(self._dim, dtype=np.float32)
            c = torch.from_numpy(np.stack([zeros if key is None else np.asarray(key, dtype=np.float32)
                                           for key in queries_c])).to(self._device)  # (B, d)
            mask = torch.tensor(has_caption, dtype=torch.bool, device=self._device)  # (B,)
        result = score_fn(
            q,
            c,
            mask,
            self._keys_q[:num_rows],  # (N, d) views, no copy
            None if c is None else self._keys_c[:num_rows],
            self._usage[:num_rows],
            self._success[:num_rows],
            self._labels[:num_rows],
            k,
            weights,
            backend=backend,
        )
        names = ("ids", "score", "sim", "sim_norm", "value", "freq")
        columns = [getattr(result, name).tolist() for name in names]  # each (B, 2, k')
        return [(self._rows(columns, i, 0), self._rows(columns, i, 1)) for i in range(batch)]

    def _rows(self, columns: list[list], query: int, slot: int) -> list[ScoredRow]:
        """One query's ranked rows of one label slot, padding (-1) dropped."""
        return [ScoredRow(self._ids[row], score, sim, sim_norm, value, freq)
                for row, score, sim, sim_norm, value, freq in zip(*(column[query][slot] for column in columns))
                if row >= 0]

    def _grow(self) -> None:
        capacity = 2 * self._keys_q.shape[0]
        self._keys_q = _resized(self._keys_q, capacity)
        self._keys_c = _resized(self._keys_c, capacity)
        self._usage = _resized(self._usage, capacity)
        self._success = _resized(self._success, capacity)
        self._labels = _resized(self._labels, capacity)


def _resized(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    grown = torch.zeros((capacity, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    grown[: tensor.shape[0]] = tensor
    return grown
