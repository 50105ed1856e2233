"""Memory-retrieval scoring, the fused two-pass Triton kernel.

Contract and score formula: :mod:`mia_kernels.memory_score`, whose ``memory_topk`` picks this kernel for
CUDA tensors (backend "triton", and "auto" on CUDA). ``triton`` is None here when the package is
not installed; the CPU backends need no Triton.

Kernel structure (each embedding row is read exactly once):
    pass 1 ``_sim_kernel``: one program per block of BLOCK_N entries computes Sim for all B
        queries (tl.dot over d tiles, fp32 accumulators), writes Sim (B, N) and the block's max
        and −min side by side (2, B, N/BLOCK_N). The wrapper folds those partials with one
        ``amax`` (a reduction over N/BLOCK_N numbers per query, not over the embeddings).
    pass 2 ``_score_topk_kernel``: one program per (query, block of N similarities) forms
        Ŝ/Val/Freq/Score and selects each label's k' best in-kernel (k' rounds of max + lowest-id
        argmax), writing (B, 2, blocks, k') candidates; ``_merge_topk_kernel`` repeats the same
        selection over candidates until one block is left. No torch.topk is involved.
    ``_terms_kernel`` fills the winners' score terms from Sim (B·2·k' numbers).
    Besides these, one torch launch folds the block partials: on a GPU each launch costs about as
    much as reading 10-20 MB, so the call is kept to five kernels plus one per merge level.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import NamedTuple

import torch
from torch import Tensor

from mia_kernels.memory_score_ref import ScoreResult, ScoreWeightsLike, caption_mask, empty_result

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU backends need no Triton
    triton = None

__all__ = ["DEFAULT_LAUNCH", "LaunchShape", "memory_topk_triton", "triton"]


class LaunchShape(NamedTuple):
    """Pass 1's tile and launch: entries per program, warps per program, software-pipeline stages."""

    block_n: int
    num_warps: int
    num_stages: int


DEFAULT_LAUNCH = LaunchShape(block_n=64, num_warps=4, num_stages=3)
"""Pass 1's default launch, chosen as the fastest (or within noise of it) of a sweep of shapes for B = 1 and
16 at 1M x 384 fp16."""


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
    block_n: int = DEFAULT_LAUNCH.block_n,
    block_score: int = 1024,
    num_warps: int = DEFAULT_LAUNCH.num_warps,
    num_stages: int = DEFAULT_LAUNCH.num_stages,
    score_warps: int = 4,
) -> ScoreResult:
    """The fused two-pass Triton kernel. block_n: entries per pass-1 program; block_score:
    similarities per pass-2 program (tests shrink it to exercise the multi-level merge); num_warps,
    num_stages: pass 1's launch; score_warps: pass 2's and the merges' (bench/bench_memory_score.py's
    GPU sweep measures the choices)."""
    if triton is None:
        raise RuntimeError("memory_topk_triton needs the triton package")
    batch, num_entries = query_q.shape[0], keys_q.shape[0]
    # A caption-free call (the common one) neither reads the GPU (no host sync) nor builds a mask.
    is_captioned = None if has_caption is None else caption_mask(has_caption, query_c, query_q)  # (B,)
    use_caption = is_captioned is not None and query_c is not None and bool(is_captioned.any())
    k_eff = min(k, num_entries)
    if k_eff == 0 or batch == 0:
        return empty_result(batch, k_eff, query_q.device)
    for name, keys in (("keys_q", keys_q), ("keys_c", keys_c)):
        if keys is not None and keys.stride(1) != 1:
            raise ValueError(f"{name} rows must be contiguous (stride(1) == 1) for the Triton kernel")

    # Triton launches on the calling thread's current CUDA device, not on the tensors' one: a store on
    # GPU 7 called from a thread whose current device is 0 would fail (or read the wrong memory).
    with on_device_of(keys_q):
        sim, minmax = _launch_sim(query_q, query_c, is_captioned if use_caption else None, keys_q, keys_c,
                                  weights, LaunchShape(block_n, num_warps, num_stages))
        usage = usage.to(torch.float32).contiguous()
        success = success.to(torch.float32).contiguous()
        top_score, top_ids = _launch_score_topk(sim, minmax, usage, success, labels.to(torch.int8).contiguous(),
                                                k_eff, weights, block_score, score_warps)
        return _launch_terms(top_ids, top_score, sim, minmax, usage, success, weights.eps)


def on_device_of(tensor: Tensor) -> AbstractContextManager:
    """The tensor's GPU as the current CUDA device for the block (nothing for a CPU tensor)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else nullcontext()


def _launch_sim(
    query_q: Tensor,
    query_c: Tensor | None,
    is_captioned: Tensor | None,
    keys_q: Tensor,
    keys_c: Tensor | None,
    weights: ScoreWeightsLike,
    launch: LaunchShape,
) -> tuple[Tensor, Tensor]:
    """Pass 1: Sim (B, N) fp32, and (2, B) = [max Sim, -min Sim] per query; is_captioned None: no
    query uses its caption. The query is rounded to the keys' dtype in the kernel (no cast launch)."""
    batch, dim = query_q.shape
    num_entries = keys_q.shape[0]
    block_n = launch.block_n
    block_b = min(64, max(16, triton.next_power_of_2(batch)))  # tl.dot needs every dim >= 16
    # fp32 tiles are twice the bytes: a narrower d tile keeps the pipelined shared memory ~64 KB.
    block_d = min(64 if keys_q.element_size() == 2 else 32, max(16, triton.next_power_of_2(dim)))
    num_blocks = triton.cdiv(num_entries, block_n)
    device = query_q.device
    use_caption = is_captioned is not None
    query_q = query_q.contiguous()  # (B, d)
    query_c = query_c.contiguous() if use_caption else query_q
    sim = torch.empty((batch, num_entries), dtype=torch.float32, device=device)  # (B, N)
    # Each block's max and -min side by side, so one amax launch folds both.
    partials = torch.empty((2, batch, num_blocks), dtype=torch.float32, device=device)
    grid = (num_blocks, triton.cdiv(batch, block_b))
    _sim_kernel[grid](
        query_q, query_c, is_captioned.to(torch.int8).contiguous() if use_caption else query_q, keys_q,
        keys_q if keys_c is None else keys_c, sim, partials,
        batch, num_entries, dim, keys_q.stride(0), keys_q.stride(0) if keys_c is None else keys_c.stride(0),
        num_blocks, weights.alpha_question, weights.alpha_caption,
        USE_CAPTION=use_caption, HAS_KEYS_C=keys_c is not None,
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    # Folding N/BLOCK_N partials per query; the embeddings are not touched again.
    return sim, partials.amax(dim=2)


def _launch_score_topk(
    sim: Tensor,
    minmax: Tensor,
    usage: Tensor,
    success: Tensor,
    labels: Tensor,
    k: int,
    weights: ScoreWeightsLike,
    block_score: int,
    num_warps: int = 4,
) -> tuple[Tensor, Tensor]:
    """Pass 2 + merges: (B, 2, k') scores and ids, ids -1 where a label ran out."""
    batch, num_entries = sim.shape
    num_blocks = triton.cdiv(num_entries, block_score)
    cand_score = torch.empty((batch, 2, num_blocks, k), dtype=torch.float32, device=sim.device)
    cand_ids = torch.empty((batch, 2, num_blocks, k), dtype=torch.int64, device=sim.device)
    _score_topk_kernel[(batch, num_blocks)](
        sim, minmax, usage, success, labels, cand_score, cand_ids,
        batch, num_entries, k, num_blocks, weights.lambda_sim, weights.lambda_value, weights.lambda_freq,
        weights.eps, BLOCK=block_score, num_warps=num_warps,
    )
    while num_blocks > 1:  # each level keeps k' of every block >= 2k' candidates: at least halves
        num_cand = num_blocks * k
        block = max(triton.next_power_of_2(2 * k), min(triton.next_power_of_2(num_cand), block_score))
        num_blocks = triton.cdiv(num_cand, block)
        merged_score = torch.empty((batch, 2, num_blocks, k), dtype=torch.float32, device=sim.device)
        merged_ids = torch.empty((batch, 2, num_blocks, k), dtype=torch.int64, device=sim.device)
        _merge_topk_kernel[(batch * 2, num_blocks)](
            cand_score, cand_ids, merged_score, merged_ids, num_cand, k, num_blocks, BLOCK=block,
            num_warps=num_warps,
        )
        cand_score, cand_ids = merged_score, merged_ids
    return cand_score.reshape(batch, 2, k), cand_ids.reshape(batch, 2, k)


def _launch_terms(ids: Tensor, score: Tensor, sim: Tensor, minmax: Tensor, usage: Tensor, success: Tensor,
                  eps: float) -> ScoreResult:
    """The winners' score terms in one launch (the same expressions as the reference's, in fp32).

    One kernel because gathering them in torch (mia_kernels.memory_score_terms) takes about 15 small
    launches, which on a GPU cost more than pass 1 itself."""
    batch, _, k = ids.shape
    terms = torch.empty((5, batch, 2, k), dtype=torch.float32, device=ids.device)
    _terms_kernel[(batch,)](ids, score, sim, minmax, usage, success, terms, batch, sim.shape[1], 2 * k, eps,
                            BLOCK=triton.next_power_of_2(2 * k))
    return ScoreResult(ids=ids, score=terms[0], sim=terms[1], sim_norm=terms[2], value=terms[3], freq=terms[4])


if triton is not None:

    @triton.jit
    def _sim_kernel(
        query_q_ptr, query_c_ptr, captioned_ptr, keys_q_ptr, keys_c_ptr,
        sim_ptr, partials_ptr,
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
            q = q.to(keys_q_ptr.dtype.element_ty)  # rounded as torch's .to() would: the reference's input
            kt = tl.load(keys_q_ptr + rows_n[None, :] * stride_kq + offs_d[:, None], mask=k_mask, other=0.0)
            acc_q = tl.dot(q, kt, acc_q, input_precision="ieee")  # (BLOCK_B, BLOCK_N), fp32
            if USE_CAPTION and HAS_KEYS_C:
                qc = tl.load(query_c_ptr + offs_b[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
                qc = qc.to(keys_c_ptr.dtype.element_ty)
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
        tl.store(partials_ptr + offs_b * num_blocks + pid_n, block_max, mask=is_b)
        tl.store(partials_ptr + (B + offs_b) * num_blocks + pid_n, -block_min, mask=is_b)

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
    def _score_terms(sim, usage, success, minmax_ptr, B, b, eps):
        """Ŝ, Val, Freq of query b (min/max Sim from pass 1's fold): one expression for scoring in
        pass 2 and for the winners' terms, so the two cannot drift apart."""
        sim_max = tl.load(minmax_ptr + b)
        sim_min = -tl.load(minmax_ptr + B + b)
        sim_norm = (sim - sim_min) / (sim_max - sim_min + eps)
        return sim_norm, success / (usage + 1.0), 1.0 / (usage + 1.0)

    @triton.jit
    def _score_topk_kernel(
        sim_ptr, minmax_ptr, usage_ptr, success_ptr, label_ptr,
        out_score_ptr, out_id_ptr, B, N, k, num_blocks,
        lambda_sim, lambda_value, lambda_freq, eps, BLOCK: tl.constexpr,
    ):
        """Score one block of N for one query and keep each label's k best."""
        b = tl.program_id(0)
        blk = tl.program_id(1)
        offs = blk * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
        in_bucket = offs < N
        sim = tl.load(sim_ptr + b.to(tl.int64) * N + offs, mask=in_bucket, other=0.0)
        usage = tl.load(usage_ptr + offs, mask=in_bucket, other=0.0)
        success = tl.load(success_ptr + offs, mask=in_bucket, other=0.0)
        label = tl.load(label_ptr + offs, mask=in_bucket, other=0)
        sim_norm, value, freq = _score_terms(sim, usage, success, minmax_ptr, B, b, eps)
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

    @triton.jit
    def _terms_kernel(
        ids_ptr, score_ptr, sim_ptr, minmax_ptr, usage_ptr, success_ptr, out_ptr, B, N, width, eps,
        BLOCK: tl.constexpr,
    ):
        """Score, Sim, Ŝ, Val, Freq of one query's 2k' winners; -inf / zeros where a label ran out."""
        b = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        is_slot = offs < width
        row = b.to(tl.int64) * width + offs
        ids = tl.load(ids_ptr + row, mask=is_slot, other=-1)
        score = tl.load(score_ptr + row, mask=is_slot, other=float("-inf"))
        is_found = ids >= 0
        safe_ids = tl.where(is_found, ids, 0)
        sim = tl.load(sim_ptr + b.to(tl.int64) * N + safe_ids, mask=is_slot, other=0.0)
        usage = tl.load(usage_ptr + safe_ids, mask=is_slot, other=0.0)
        success = tl.load(success_ptr + safe_ids, mask=is_slot, other=0.0)
        sim_norm, value, freq = _score_terms(sim, usage, success, minmax_ptr, B, b, eps)
        plane = B * width  # 2k'·B numbers: int32 is plenty
        tl.store(out_ptr + row, tl.where(is_found, score, float("-inf")), mask=is_slot)
        tl.store(out_ptr + plane + row, tl.where(is_found, sim, 0.0), mask=is_slot)
        tl.store(out_ptr + 2 * plane + row, tl.where(is_found, sim_norm, 0.0), mask=is_slot)
        tl.store(out_ptr + 3 * plane + row, tl.where(is_found, value, 0.0), mask=is_slot)
        tl.store(out_ptr + 4 * plane + row, tl.where(is_found, freq, 0.0), mask=is_slot)
