"""Fused memory-retrieval scoring (paper appendix 10): Triton kernel, CPU fast path, dispatcher.

Public contract (the memory store calls exactly this)::

    memory_topk(query_q, query_c, has_caption, keys_q, keys_c, usage, success, labels, k, weights,
                *, backend="auto") -> ScoreResult

Inputs (B queries against one bucket of N entries, embedding width d):
    query_q      (B, d) float32 or float16, L2-normalised question embeddings.
    query_c      (B, d) or None, caption embeddings of the queries.
    has_caption  (B,) bool or None; None means no query has a caption.
    keys_q       (N, d) question embeddings of the entries (rows must be contiguous for Triton).
    keys_c       (N, d) or None, caption embeddings of the entries, zero rows where an entry has
                 no caption; None means no entry has one.
    usage, success  (N,) float32 counts u_i and s_i.
    labels       (N,) int8/bool; nonzero = positive (judged correct), 0 = negative.
    k            memories wanted per label; k' = min(k, N).
    weights      ``mia_engine.memory.config.ScoreWeights`` (or anything with its fields).

Score, for query b and entry i (cosines are dot products because embeddings are normalised):
    Sim  = alpha_question·<q, k_i> + alpha_caption·<c, c_i> if the query has a caption, else <q, k_i>
    Ŝ    = (Sim − min Sim) / (max Sim − min Sim + eps), min/max over the whole bucket (both labels)
    Val  = s_i / (u_i + 1),  Freq = 1 / (u_i + 1)
    Score = lambda_sim·Ŝ + lambda_value·Val + lambda_freq·Freq

Output :class:`ScoreResult`, every tensor (B, 2, k'), axis 1 = [positives, negatives], sorted by
descending score; ties go to the lower row index so every backend returns the same ids. Slots
beyond the number of entries of a label hold id -1, score -inf and zeros. N = 0 or k = 0 gives
(B, 2, 0) tensors.

Precision: the query is rounded to the keys' dtype (fp16 keys -> fp16 dot inputs, which is what
lets the GPU use tensor cores at 1M×384) and every product is accumulated in fp32.

Backends: "torch" is the plain reference (:mod:`kernels.memory_score_ref`); "cpu" is the fast
vectorised CPU path; "triton" is the fused kernel; "auto" takes "triton" for CUDA tensors and
"cpu" otherwise ("cpu" was 3-5x faster than "torch" from 10k entries up and within 0.015 ms of
it at 1k; bench/RESULTS.md, section 3).

Numerics: if every Sim in a bucket is equal up to rounding, max − min is ~1e-7 and eps = 1e-8
does not damp it, so Ŝ magnifies last-bit differences into [0, 1]; backends summing in another
order may then rank such entries differently. That is the paper's formula, not a kernel bug.

Triton kernel structure (each embedding row is read exactly once):
    pass 1 ``_sim_kernel``: one program per block of BLOCK_N entries computes Sim for all B
        queries (tl.dot over d tiles, fp32 accumulators), writes Sim (B, N) and the block's
        min/max (B, N/BLOCK_N). The wrapper folds those partials with ``amin``/``amax`` (a
        reduction over N/BLOCK_N numbers per query, not over the embeddings).
    pass 2 ``_score_topk_kernel``: one program per (query, block of N similarities) forms
        Ŝ/Val/Freq/Score and selects each label's k' best in-kernel (k' rounds of max + lowest-id
        argmax), writing (B, 2, blocks, k') candidates; ``_merge_topk_kernel`` repeats the same
        selection over candidates until one block is left. No torch.topk is involved.
    The four score terms of the k' winners are gathered in torch from Sim (B·2·k' numbers).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from kernels.memory_score_ref import (
    ScoreResult,
    ScoreWeightsLike,
    caption_mask,
    empty_result,
    memory_topk_ref,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU backends need no Triton
    triton = None

__all__ = ["Backend", "ScoreResult", "memory_topk", "memory_topk_cpu", "memory_topk_triton"]

Backend = Literal["auto", "triton", "torch", "cpu"]
_EMBEDDING_DTYPES = (torch.float32, torch.float16)
"""bf16 is left out: Triton's CPU interpreter computes bf16 dots wrongly, so it could not be tested."""
_UPCAST_BLOCK_ROWS = 16384
"""Rows of fp16 keys upcast at a time on CPU (25 MB of fp32 at d=384): few enough blocks that
the per-block call overhead stays small, small enough not to double the memory of the keys."""
_NUMPY_MIN_BATCH = 16
"""From this many queries up, numpy's GEMM beat torch's on CPU (see ``_blas_dot``)."""
_THREADED_GEMV_MIN_ELEMENTS = 1 << 21
"""N·d from which a single-query product uses the threaded BLAS (8 MB of fp32 keys)."""


def memory_topk(
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
    *,
    backend: Backend = "auto",
) -> ScoreResult:
    """Top-k positive and negative memories per query; see the module docstring for the contract."""
    _check_inputs(query_q, query_c, has_caption, keys_q, keys_c, usage, success, labels, k)
    args = (query_q, query_c, has_caption, keys_q, keys_c, usage, success, labels, k, weights)
    chosen = _resolve_backend(backend, query_q)
    if chosen == "torch":
        return memory_topk_ref(*args)
    if chosen == "cpu":
        return memory_topk_cpu(*args)
    return memory_topk_triton(*args)


def _resolve_backend(backend: str, query_q: Tensor) -> str:
    """Map "auto" to Triton on CUDA, else to the CPU path measured fastest ("cpu")."""
    if backend not in ("auto", "triton", "torch", "cpu"):
        raise ValueError(f"unknown backend {backend!r}")
    if backend == "auto":
        return "triton" if query_q.is_cuda and triton is not None else "cpu"
    if backend == "triton" and triton is None:
        raise RuntimeError("backend='triton' needs the triton package")
    if backend == "cpu" and query_q.device.type != "cpu":
        raise ValueError("backend='cpu' needs CPU tensors")
    return backend


def _check_inputs(
    query_q: Tensor,
    query_c: Tensor | None,
    has_caption: Tensor | None,
    keys_q: Tensor,
    keys_c: Tensor | None,
    usage: Tensor,
    success: Tensor,
    labels: Tensor,
    k: int,
) -> None:
    """Shape/dtype/device checks shared by all backends, so every backend fails the same way."""
    if query_q.dim() != 2 or keys_q.dim() != 2 or query_q.shape[1] != keys_q.shape[1]:
        raise ValueError(f"need query_q (B, d) and keys_q (N, d), got {tuple(query_q.shape)} "
                         f"and {tuple(keys_q.shape)}")
    batch, num_entries = query_q.shape[0], keys_q.shape[0]
    for name, tensor, shape in (("query_c", query_c, query_q.shape), ("keys_c", keys_c, keys_q.shape),
                                ("has_caption", has_caption, (batch,)), ("usage", usage, (num_entries,)),
                                ("success", success, (num_entries,)), ("labels", labels, (num_entries,))):
        if tensor is None:
            continue
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
        if tensor.device != query_q.device:
            raise ValueError(f"{name} is on {tensor.device}, query_q on {query_q.device}")
    for name, tensor in (("query_q", query_q), ("query_c", query_c), ("keys_q", keys_q), ("keys_c", keys_c)):
        if tensor is not None and tensor.dtype not in _EMBEDDING_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}, expected one of {_EMBEDDING_DTYPES}")
    if keys_c is not None and keys_c.dtype != keys_q.dtype:
        raise TypeError(f"keys_c dtype {keys_c.dtype} differs from keys_q dtype {keys_q.dtype}")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")


# ----------------------------------------------------------------------------------------------
# Pieces shared by the fast backends
# ----------------------------------------------------------------------------------------------


def _gather_terms(
    ids: Tensor,
    score: Tensor,
    sim: Tensor,
    sim_min: Tensor,
    sim_max: Tensor,
    usage: Tensor,
    success: Tensor,
    eps: float,
) -> ScoreResult:
    """Fill the score terms of the selected entries; ids (B, 2, k'), sim (B, N), min/max (B,)."""
    is_found = ids >= 0  # (B, 2, k')
    safe_ids = ids.clamp(min=0)
    batch = ids.shape[0]
    sim_sel = torch.gather(sim, 1, safe_ids.reshape(batch, -1)).reshape(ids.shape)  # (B, 2, k')
    # Same expression as the reference, so Ŝ matches it bit for bit given the same Sim.
    sim_norm = (sim_sel - sim_min[:, None, None]) / (sim_max - sim_min + eps)[:, None, None]
    usage_sel = usage[safe_ids].float()  # (B, 2, k')
    value = success[safe_ids].float() / (usage_sel + 1.0)
    freq = 1.0 / (usage_sel + 1.0)
    zero = torch.zeros((), dtype=torch.float32, device=ids.device)
    return ScoreResult(
        ids=ids,
        score=torch.where(is_found, score, float("-inf")),
        sim=torch.where(is_found, sim_sel, zero),
        sim_norm=torch.where(is_found, sim_norm, zero),
        value=torch.where(is_found, value, zero),
        freq=torch.where(is_found, freq, zero),
    )


# ----------------------------------------------------------------------------------------------
# CPU fast path
# ----------------------------------------------------------------------------------------------


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
    same step lost at every size measured, by 1.2-1.6x on the quiet 2-core box and by up to 300x
    (0.5 ms vs 150-200 ms at 100k) while other processes held the cores, where a parallel region
    waits for a descheduled thread (bench/RESULTS.md, section 3). Arithmetic follows the reference
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
    return _gather_terms(torch.from_numpy(top_ids), torch.from_numpy(top_score.reshape(batch, 2, k_eff)),
                         torch.from_numpy(sim), torch.from_numpy(sim_min), torch.from_numpy(sim_max),
                         usage.float(), success.float(), weights.eps)


def _mask_by_label(score: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(B, N) scores -> (B, 2, N): [positives only, negatives only], -inf elsewhere.

    Adding a 0/-inf mask looked up per label is ~10x faster than np.where on a bool mask.
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
    # page-faults a new allocation, ~20x slower when measured) and multiply it with torch, so the
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

    Measured on the 2-core AMD EPYC dev box (bench/RESULTS.md, section 3), 100k×384 keys,
    quiet machine: B = 1: numpy (OpenBLAS) sgemv 3.2 ms vs torch (MKL) 11 ms, whose sgemv runs
    one thread; B = 2..8: torch ``keys @ query.T`` 3.9-7.5 ms vs numpy 10-15 ms; B >= 16: numpy
    ``query @ keys.T`` 13-30 ms vs torch 16-55 ms. A single query against a small bucket (under
    8 MB of keys, ~5k entries at d=384) stays on MKL's one thread: OpenBLAS's threads save under
    0.1 ms there, but its call took ~4 ms (a scheduler slice) when another process held the other
    core. From ~10k entries (two 15 MB matrices with captions) the threads win by 3x.
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


# ----------------------------------------------------------------------------------------------
# Triton backend
# ----------------------------------------------------------------------------------------------


def memory_topk_triton(
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
    *,
    block_n: int = 64,
    block_score: int = 1024,
) -> ScoreResult:
    """The fused two-pass Triton kernel. block_n: entries per pass-1 program; block_score:
    similarities per pass-2 program (tests shrink it to exercise the multi-level merge)."""
    if triton is None:
        raise RuntimeError("memory_topk_triton needs the triton package")
    batch, num_entries = query_q.shape[0], keys_q.shape[0]
    is_captioned = caption_mask(has_caption, query_c, query_q)  # (B,)
    k_eff = min(k, num_entries)
    if k_eff == 0 or batch == 0:
        return empty_result(batch, k_eff, query_q.device)
    for name, keys in (("keys_q", keys_q), ("keys_c", keys_c)):
        if keys is not None and keys.stride(1) != 1:
            raise ValueError(f"{name} rows must be contiguous (stride(1) == 1) for the Triton kernel")

    sim, sim_min, sim_max = _launch_sim(query_q, query_c, is_captioned, keys_q, keys_c, weights, block_n)
    usage = usage.to(torch.float32).contiguous()
    success = success.to(torch.float32).contiguous()
    top_score, top_ids = _launch_score_topk(sim, sim_min, sim_max, usage, success,
                                            labels.to(torch.int8).contiguous(), k_eff, weights, block_score)
    return _gather_terms(top_ids, top_score, sim, sim_min, sim_max, usage, success, weights.eps)


def _launch_sim(
    query_q: Tensor,
    query_c: Tensor | None,
    is_captioned: Tensor,
    keys_q: Tensor,
    keys_c: Tensor | None,
    weights: ScoreWeightsLike,
    block_n: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pass 1: Sim (B, N) fp32 and its per-query min/max (B,)."""
    batch, dim = query_q.shape
    num_entries = keys_q.shape[0]
    use_caption = bool(is_captioned.any())
    block_b = min(64, max(16, triton.next_power_of_2(batch)))  # tl.dot needs every dim >= 16
    # fp32 tiles are twice the bytes: a narrower d tile keeps the pipelined shared memory ~64 KB.
    block_d = min(64 if keys_q.element_size() == 2 else 32, max(16, triton.next_power_of_2(dim)))
    num_blocks = triton.cdiv(num_entries, block_n)
    device = query_q.device
    query_q = query_q.to(keys_q.dtype).contiguous()  # (B, d)
    query_c = query_q if query_c is None or not use_caption else query_c.to(keys_q.dtype).contiguous()
    sim = torch.empty((batch, num_entries), dtype=torch.float32, device=device)  # (B, N)
    block_min = torch.empty((batch, num_blocks), dtype=torch.float32, device=device)  # (B, N/BLOCK_N)
    block_max = torch.empty_like(block_min)
    grid = (num_blocks, triton.cdiv(batch, block_b))
    _sim_kernel[grid](
        query_q, query_c, is_captioned.to(torch.int8).contiguous(), keys_q,
        keys_q if keys_c is None else keys_c, sim, block_min, block_max,
        batch, num_entries, dim, keys_q.stride(0), keys_q.stride(0) if keys_c is None else keys_c.stride(0),
        num_blocks, weights.alpha_question, weights.alpha_caption,
        USE_CAPTION=use_caption, HAS_KEYS_C=keys_c is not None,
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_D=block_d,
    )
    # Folding N/BLOCK_N partials per query; the embeddings are not touched again.
    return sim, block_min.amin(dim=1), block_max.amax(dim=1)


def _launch_score_topk(
    sim: Tensor,
    sim_min: Tensor,
    sim_max: Tensor,
    usage: Tensor,
    success: Tensor,
    labels: Tensor,
    k: int,
    weights: ScoreWeightsLike,
    block_score: int,
) -> tuple[Tensor, Tensor]:
    """Pass 2 + merges: (B, 2, k') scores and ids, ids -1 where a label ran out."""
    batch, num_entries = sim.shape
    num_blocks = triton.cdiv(num_entries, block_score)
    cand_score = torch.empty((batch, 2, num_blocks, k), dtype=torch.float32, device=sim.device)
    cand_ids = torch.empty((batch, 2, num_blocks, k), dtype=torch.int64, device=sim.device)
    _score_topk_kernel[(batch, num_blocks)](
        sim, sim_min, sim_max, usage, success, labels, cand_score, cand_ids,
        num_entries, k, num_blocks, weights.lambda_sim, weights.lambda_value, weights.lambda_freq,
        weights.eps, BLOCK=block_score,
    )
    while num_blocks > 1:  # each level keeps k' of every block >= 2k' candidates: at least halves
        num_cand = num_blocks * k
        block = max(triton.next_power_of_2(2 * k), min(triton.next_power_of_2(num_cand), block_score))
        num_blocks = triton.cdiv(num_cand, block)
        merged_score = torch.empty((batch, 2, num_blocks, k), dtype=torch.float32, device=sim.device)
        merged_ids = torch.empty((batch, 2, num_blocks, k), dtype=torch.int64, device=sim.device)
        _merge_topk_kernel[(batch * 2, num_blocks)](
            cand_score, cand_ids, merged_score, merged_ids, num_cand, k, num_blocks, BLOCK=block,
        )
        cand_score, cand_ids = merged_score, merged_ids
    return cand_score.reshape(batch, 2, k), cand_ids.reshape(batch, 2, k)


if triton is not None:

    @triton.jit
    def _sim_kernel(
        query_q_ptr, query_c_ptr, captioned_ptr, keys_q_ptr, keys_c_ptr,
        sim_ptr, block_min_ptr, block_max_ptr,
        B, N, D, stride_kq, stride_kc, num_blocks, alpha_q, alpha_c,
        USE_CAPTION: tl.constexpr, HAS_KEYS_C: tl.constexpr,
        BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """Sim for BLOCK_N entries × BLOCK_B queries; each key tile is loaded once."""
        pid_n = tl.program_id(0)
        offs_b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)  # (BLOCK_B,)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        is_b = offs_b < B
        is_n = offs_n < N
        rows_n = offs_n.to(tl.int64)
        acc_q = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
        acc_c = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)  # (BLOCK_D,)
            is_d = offs_d < D
            q_mask = is_b[:, None] & is_d[None, :]
            k_mask = is_d[:, None] & is_n[None, :]
            q = tl.load(query_q_ptr + offs_b[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
            kt = tl.load(keys_q_ptr + rows_n[None, :] * stride_kq + offs_d[:, None], mask=k_mask, other=0.0)
            acc_q = tl.dot(q, kt, acc_q, input_precision="ieee")  # (BLOCK_B, BLOCK_N), fp32
            if USE_CAPTION and HAS_KEYS_C:
                qc = tl.load(query_c_ptr + offs_b[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
                kct = tl.load(keys_c_ptr + rows_n[None, :] * stride_kc + offs_d[:, None], mask=k_mask, other=0.0)
                acc_c = tl.dot(qc, kct, acc_c, input_precision="ieee")
        sim = acc_q
        if USE_CAPTION:
            is_captioned = tl.load(captioned_ptr + offs_b, mask=is_b, other=0) != 0
            sim = tl.where(is_captioned[:, None], alpha_q * acc_q + alpha_c * acc_c, acc_q)
        is_valid = is_b[:, None] & is_n[None, :]
        tl.store(sim_ptr + offs_b.to(tl.int64)[:, None] * N + rows_n[None, :], sim, mask=is_valid)
        block_min = tl.min(tl.where(is_valid, sim, float("inf")), axis=1)  # (BLOCK_B,)
        block_max = tl.max(tl.where(is_valid, sim, float("-inf")), axis=1)
        tl.store(block_min_ptr + offs_b * num_blocks + pid_n, block_min, mask=is_b)
        tl.store(block_max_ptr + offs_b * num_blocks + pid_n, block_max, mask=is_b)

    @triton.jit
    def _select_topk(scores, ids, k, out_score_ptr, out_id_ptr):
        """Write the k best (score, id) of a block, descending, ties to the lowest id.

        -inf marks an absent candidate; once only those remain the slot gets id -1.
        """
        for slot in range(k):
            best = tl.max(scores, axis=0)
            is_best = (scores == best) & (ids >= 0)
            best_id = tl.min(tl.where(is_best, ids, 9223372036854775807), axis=0)
            best_id = tl.where(best > float("-inf"), best_id, -1)
            tl.store(out_score_ptr + slot, best)
            tl.store(out_id_ptr + slot, best_id)
            scores = tl.where(ids == best_id, float("-inf"), scores)

    @triton.jit
    def _score_topk_kernel(
        sim_ptr, sim_min_ptr, sim_max_ptr, usage_ptr, success_ptr, label_ptr,
        out_score_ptr, out_id_ptr, N, k, num_blocks,
        lambda_sim, lambda_value, lambda_freq, eps, BLOCK: tl.constexpr,
    ):
        """Score one block of N for one query and keep each label's k best."""
        b = tl.program_id(0)
        blk = tl.program_id(1)
        offs = blk * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
        in_bucket = offs < N
        sim = tl.load(sim_ptr + b.to(tl.int64) * N + offs, mask=in_bucket, other=0.0)
        sim_min = tl.load(sim_min_ptr + b)
        sim_max = tl.load(sim_max_ptr + b)
        usage = tl.load(usage_ptr + offs, mask=in_bucket, other=0.0)
        success = tl.load(success_ptr + offs, mask=in_bucket, other=0.0)
        label = tl.load(label_ptr + offs, mask=in_bucket, other=0)
        sim_norm = (sim - sim_min) / (sim_max - sim_min + eps)
        value = success / (usage + 1.0)
        freq = 1.0 / (usage + 1.0)
        score = lambda_sim * sim_norm + lambda_value * value + lambda_freq * freq  # (BLOCK,)
        ids = offs.to(tl.int64)
        for slot in tl.static_range(2):  # 0: positives, 1: negatives
            if slot == 0:
                keep = in_bucket & (label != 0)
            else:
                keep = in_bucket & (label == 0)
            out = ((b * 2 + slot) * num_blocks + blk).to(tl.int64) * k
            _select_topk(tl.where(keep, score, float("-inf")), tl.where(keep, ids, -1), k,
                         out_score_ptr + out, out_id_ptr + out)

    @triton.jit
    def _merge_topk_kernel(
        in_score_ptr, in_id_ptr, out_score_ptr, out_id_ptr, M, k, num_blocks, BLOCK: tl.constexpr,
    ):
        """Keep the k best of one block of M candidates of one (query, label) row."""
        row = tl.program_id(0)
        blk = tl.program_id(1)
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        is_valid = offs < M
        base = row.to(tl.int64) * M
        scores = tl.load(in_score_ptr + base + offs, mask=is_valid, other=float("-inf"))
        ids = tl.load(in_id_ptr + base + offs, mask=is_valid, other=-1)
        out = (row * num_blocks + blk).to(tl.int64) * k
        _select_topk(scores, ids, k, out_score_ptr + out, out_id_ptr + out)
