"""Plain torch reference of the memory-retrieval score (paper appendix 10).

This is the obviously-correct version the fused Triton kernel and the CPU fast path in
:mod:`mia_kernels.memory_score` are tested against. It favours clarity over speed: every term is
a named (B, N) tensor and the top-k is a stable full sort, so ties go to the lower row index.

It also owns :class:`ScoreResult`, the result type of the public contract, so that the fast
module can import the reference without an import cycle.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class ScoreResult(NamedTuple):
    """Top-k memories per query; every tensor is (B, 2, k') with k' = min(k, N).

    Axis 1 is [positives (label 1, correct), negatives (label 0, incorrect)]. Slots beyond the
    number of entries of that label hold id -1, score -inf and 0 in the four score terms.
    """

    ids: Tensor
    """int64 row index into the bucket, -1 where fewer than k' entries of that label exist."""
    score: Tensor
    """float32 Score = lambda_sim·Ŝ + lambda_value·Val + lambda_freq·Freq (-inf where id == -1)."""
    sim: Tensor
    """float32 raw Sim (weighted cosine)."""
    sim_norm: Tensor
    """float32 Ŝ, Sim min-max normalised over the whole bucket (both labels)."""
    value: Tensor
    """float32 Val = success / (usage + 1)."""
    freq: Tensor
    """float32 Freq = 1 / (usage + 1)."""


class ScoreWeightsLike(Protocol):
    """The fields of ``mia_engine.memory.config.ScoreWeights`` that the score reads."""

    alpha_question: float
    alpha_caption: float
    lambda_sim: float
    lambda_value: float
    lambda_freq: float
    eps: float


def caption_mask(has_caption: Tensor | None, query_c: Tensor | None, query_q: Tensor) -> Tensor:
    """(B,) bool on the query's device: which queries use the caption term.

    None means no query has a caption. A captioned query without ``query_c`` is a caller bug.
    """
    batch = query_q.shape[0]
    if has_caption is None:
        return torch.zeros(batch, dtype=torch.bool, device=query_q.device)
    has_caption = has_caption.to(device=query_q.device, dtype=torch.bool).reshape(-1)
    if has_caption.numel() != batch:
        raise ValueError(f"has_caption has {has_caption.numel()} entries, expected B={batch}")
    if bool(has_caption.any()) and query_c is None:
        raise ValueError("has_caption marks a query with a caption but query_c is None")
    return has_caption


def empty_result(batch: int, k: int, device: torch.device) -> ScoreResult:
    """All-padding result of shape (B, 2, k): what an entry-less label gets."""
    shape = (batch, 2, k)
    zeros = torch.zeros(shape, dtype=torch.float32, device=device)
    return ScoreResult(
        ids=torch.full(shape, -1, dtype=torch.int64, device=device),
        score=torch.full(shape, float("-inf"), dtype=torch.float32, device=device),
        sim=zeros,
        sim_norm=zeros.clone(),
        value=zeros.clone(),
        freq=zeros.clone(),
    )


def memory_topk_ref(
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
    """Reference scoring: same contract as :func:`mia_kernels.memory_score.memory_topk`."""
    batch, num_entries = query_q.shape[0], keys_q.shape[0]
    is_captioned = caption_mask(has_caption, query_c, query_q)  # (B,)
    k_eff = min(k, num_entries)
    if k_eff == 0 or batch == 0:
        return empty_result(batch, k_eff, query_q.device)
    sim = reference_sim(query_q, query_c, is_captioned, keys_q, keys_c, weights)  # (B, N)

    sim_min = sim.min(dim=1, keepdim=True).values  # (B, 1), over the whole bucket
    sim_max = sim.max(dim=1, keepdim=True).values  # (B, 1)
    sim_norm = (sim - sim_min) / (sim_max - sim_min + weights.eps)  # (B, N)
    usage = usage.float()
    value = success.float() / (usage + 1.0)  # (N,)
    freq = 1.0 / (usage + 1.0)  # (N,)
    score = weights.lambda_sim * sim_norm + weights.lambda_value * value + weights.lambda_freq * freq

    result = empty_result(batch, k_eff, query_q.device)
    is_positive = labels.to(query_q.device) != 0  # (N,)
    for label_slot, entry_mask in enumerate((is_positive, ~is_positive)):
        rows = torch.nonzero(entry_mask).reshape(-1)  # (N_label,), ascending
        # Stable descending sort: equal scores keep ascending row order, i.e. lower index wins.
        order = torch.sort(score[:, rows], dim=1, descending=True, stable=True).indices
        top = rows[order[:, :k_eff]]  # (B, n) with n = min(k', N_label)
        n = top.shape[1]
        result.ids[:, label_slot, :n] = top
        result.score[:, label_slot, :n] = torch.gather(score, 1, top)
        result.sim[:, label_slot, :n] = torch.gather(sim, 1, top)
        result.sim_norm[:, label_slot, :n] = torch.gather(sim_norm, 1, top)
        result.value[:, label_slot, :n] = value[top]
        result.freq[:, label_slot, :n] = freq[top]
    return result


def reference_sim(
    query_q: Tensor,
    query_c: Tensor | None,
    is_captioned: Tensor,
    keys_q: Tensor,
    keys_c: Tensor | None,
    weights: ScoreWeightsLike,
) -> Tensor:
    """Raw Sim (B, N). The query is rounded to the keys' dtype, the products summed in fp32."""
    cos_q = query_q.to(keys_q.dtype).float() @ keys_q.float().T  # (B, N)
    cos_c = torch.zeros_like(cos_q)  # (B, N); entries without caption have zero keys
    if keys_c is not None and query_c is not None:
        cos_c = query_c.to(keys_c.dtype).float() @ keys_c.float().T  # (B, N)
    sim_captioned = weights.alpha_question * cos_q + weights.alpha_caption * cos_c
    return torch.where(is_captioned[:, None], sim_captioned, cos_q)  # (B, N)
