"""Memory-retrieval scoring, CPU fast path: one BLAS product per embedding matrix, then (B, N) numpy.

Contract and score formula: :mod:`mia_kernels.memory_score`, whose ``memory_topk`` picks this path for
CPU tensors (backend "cpu", and "auto" off CUDA), since it is faster than the torch reference from
about 10k entries up and level with it below.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mia_kernels.memory_score_ref import ScoreResult, ScoreWeightsLike, caption_mask, empty_result
from mia_kernels.memory_score_terms import gather_terms

__all__ = ["memory_topk_cpu"]

_UPCAST_BLOCK_ROWS = 16384
"""Rows of fp16 keys upcast at a time on CPU (25 MB of fp32 at d=384): few enough blocks that
the per-block call overhead stays small, small enough not to double the memory of the keys."""
_NUMPY_MIN_BATCH = 16
"""From this many queries up, numpy's GEMM beat torch's on CPU (see ``_blas_dot``)."""
_THREADED_GEMV_MIN_ELEMENTS = 1 << 21
"""N·d from which a single-query product uses the threaded BLAS (8 MB of fp32 keys)."""


def memory_topk_cpu(
    query_q: Tensor,
    query_c: Tensor | None,
    has_caption: Tensor | None,
    keys_q: Tensor,
    keys_c: Tensor | None,
    usage: Tensor,
    success: Tensor,
    labels: Tensor,
    k: int,
    weights: ScoreWeightsLike,
) -> ScoreResult:
    """Vectorised CPU scoring: one BLAS product per embedding matrix, then (B, N) numpy work.

    The product streams N·d embeddings and sets the latency. Everything after it is
    single-threaded numpy on B·N similarities, on purpose: torch's OpenMP-parallel ops for the
    same step were slower at every size measured, and far slower while other processes held the
    cores, where a parallel region waits for a descheduled thread. Arithmetic follows the reference
    operation by operation in fp32, so given the same Sim the scores match it bit for bit.
    """
    batch, num_entries = query_q.shape[0], keys_q.shape[0]
    is_captioned = caption_mask(has_caption, query_c, query_q)  # (B,)
    k_eff = min(k, num_entries)
    if k_eff == 0 or batch == 0:
        return empty_result(batch, k_eff, query_q.device)

    sim = _cpu_sim(query_q, query_c, is_captioned, keys_q, keys_c, weights)  # (B, N)
    sim_min, sim_max = sim.min(axis=1), sim.max(axis=1)  # (B,), over the whole bucket
    usage_np = usage.detach().float().numpy()  # (N,)
    success_np = success.detach().float().numpy()
    # Score = ((λs·Ŝ) + λv·Val) + λf·Freq, in the reference's order; Python floats stay fp32 (NEP 50).
    score = sim - sim_min[:, None]  # (B, N)
    score /= (sim_max - sim_min + weights.eps)[:, None]
    score *= weights.lambda_sim
    score += weights.lambda_value * (success_np / (usage_np + 1.0))
    score += weights.lambda_freq * (1.0 / (usage_np + 1.0))

    by_label = _mask_by_label(score, labels.detach().numpy())  # (B, 2, N)
    top_score, top_ids = _topk_lowest_index(by_label.reshape(batch * 2, num_entries), k_eff)
    top_ids = np.where(np.isneginf(top_score), -1, top_ids).reshape(batch, 2, k_eff)
    return gather_terms(torch.from_numpy(top_ids), torch.from_numpy(top_score.reshape(batch, 2, k_eff)),
                         torch.from_numpy(sim), torch.from_numpy(sim_min), torch.from_numpy(sim_max),
                         usage.float(), success.float(), weights.eps)


def _mask_by_label(score: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(B, N) scores -> (B, 2, N): [positives only, negatives only], -inf elsewhere.

    Adding a 0/-inf mask looked up per label is much faster than np.where on a bool mask.
    """
    is_positive = (labels != 0).view(np.int8)  # (N,) 1 = positive
    by_label = np.empty((score.shape[0], 2, score.shape[1]), dtype=np.float32)  # (B, 2, N)
    for slot, mask_of_label in enumerate(([-np.inf, 0.0], [0.0, -np.inf])):  # [negative, positive] -> mask
        np.add(score, np.take(np.array(mask_of_label, dtype=np.float32), is_positive), out=by_label[:, slot])
    return by_label


def _cpu_sim(
    query_q: Tensor,
    query_c: Tensor | None,
    is_captioned: Tensor,
    keys_q: Tensor,
    keys_c: Tensor | None,
    weights: ScoreWeightsLike,
) -> np.ndarray:
    """Sim (B, N) fp32; the caption product runs only for captioned queries."""
    sim = _cpu_dot(query_q, keys_q)  # (B, N)
    captioned_rows = np.flatnonzero(is_captioned.numpy())
    if captioned_rows.size == 0:
        return sim
    cos_c = np.zeros((captioned_rows.size, sim.shape[1]), dtype=np.float32)  # no entry has a caption
    if keys_c is not None:
        cos_c = _cpu_dot(query_c[torch.from_numpy(captioned_rows)], keys_c)  # (B_c, N)
    sim[captioned_rows] = weights.alpha_question * sim[captioned_rows] + weights.alpha_caption * cos_c
    return sim


def _cpu_dot(query: Tensor, keys: Tensor) -> np.ndarray:
    """query (B, d) · keys (N, d)ᵀ -> (B, N) fp32, the query first rounded to the keys' dtype."""
    query = query.detach().to(keys.dtype).float()  # (B, d)
    keys = keys.detach()
    if keys.dtype == torch.float32:
        return _blas_dot(query, keys)
    # fp16 keys: upcast a block at a time into one reused buffer (a fresh .float() per block
    # page-faults a new allocation, much slower when measured) and multiply it with torch, so the
    # loop stays in one thread pool: alternating torch's copy with numpy's BLAS per block was 3x
    # slower. Even so the conversion makes fp16 keys several times slower than fp32 on CPU.
    out = torch.empty((query.shape[0], keys.shape[0]), dtype=torch.float32)  # (B, N)
    buffer = torch.empty((min(_UPCAST_BLOCK_ROWS, keys.shape[0]), keys.shape[1]), dtype=torch.float32)
    for start in range(0, keys.shape[0], _UPCAST_BLOCK_ROWS):
        block = keys[start:start + _UPCAST_BLOCK_ROWS]
        upcast = buffer[: block.shape[0]].copy_(block)  # (n, d)
        out[:, start:start + block.shape[0]] = query @ upcast.T
    return out.numpy()


def _blas_dot(query: Tensor, keys: Tensor) -> np.ndarray:
    """(B, d) fp32 · (N, d)ᵀ fp32 -> (B, N), through the BLAS call measured fastest per shape.

    Which library wins depends on the batch, as measured on a 2-core x86 CPU at 100k x 384 keys:
    B = 1 numpy (OpenBLAS) sgemv, whose threads beat torch's one-thread (MKL) sgemv; B = 2..8 torch
    ``keys @ query.T``; B >= 16 numpy ``query @ keys.T``. A single query against a small bucket
    (under 8 MB of keys, ~5k entries at d=384) stays on MKL's one thread: OpenBLAS's threads save
    little there and cost a scheduler slice when another process holds a core.
    """
    batch = query.shape[0]
    if batch == 1 and keys.numel() < _THREADED_GEMV_MIN_ELEMENTS:
        return (keys @ query[0]).numpy()[None, :]  # (1, N)
    if batch == 1 or batch >= _NUMPY_MIN_BATCH:
        return query.numpy() @ keys.numpy().T  # (B, N)
    return np.ascontiguousarray((keys @ query.T).numpy().T)  # (B, N)


def _topk_lowest_index(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-k of (R, N) scores, sorted descending, ties to the lower column index.

    argpartition does not say which of equal values it keeps, so take k+1 candidates, order them
    by (score desc, index asc) — exact within the candidates — and redo a row with a stable full
    sort only when its k-th and (k+1)-th scores tie (rare: duplicate entries). -inf marks masked
    entries; they become id -1, so their order does not matter.
    """
    num_cols = scores.shape[1]
    num_cand = min(k + 1, num_cols)
    cand = np.argpartition(-scores, num_cand - 1, axis=1)[:, :num_cand]  # (R, k+1), unordered
    cand_score = np.take_along_axis(scores, cand, axis=1)
    order = np.lexsort((cand, -cand_score), axis=-1)  # score desc, then index asc
    ids = np.take_along_axis(cand, order, axis=1)
    values = np.take_along_axis(cand_score, order, axis=1)
    if num_cand > k:
        is_tied = (values[:, k - 1] == values[:, k]) & np.isfinite(values[:, k])
        for row in np.flatnonzero(is_tied):
            ids[row] = np.argsort(-scores[row], kind="stable")[:num_cand]
            values[row] = scores[row, ids[row]]
    return values[:, :k], ids[:, :k].astype(np.int64)

