"""Memory-retrieval scoring, the fused two-pass Triton kernel.

Contract and score formula: :mod:`kernels.memory_score`, whose ``memory_topk`` picks this kernel for
CUDA tensors (backend "triton", and "auto" on CUDA). ``triton`` is None here when the package is
not installed; the CPU backends need no Triton.

Kernel structure (each embedding row is read exactly once):
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

import torch
from torch import Tensor

from kernels.memory_score_ref import ScoreResult, ScoreWeightsLike, caption_mask, empty_result
from kernels.memory_score_terms import gather_terms

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU backends need no Triton
    triton = None

__all__ = ["memory_topk_triton", "triton"]


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
    return gather_terms(top_ids, top_score, sim, sim_min, sim_max, usage, success, weights.eps)


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
