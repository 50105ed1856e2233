"""The score terms of the selected entries, filled in torch; shared by the CPU and Triton backends
(:mod:`mia_kernels.memory_score_cpu`, :mod:`mia_kernels.memory_score_triton`)."""

from __future__ import annotations

import torch
from torch import Tensor

from mia_kernels.memory_score_ref import ScoreResult


def gather_terms(
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

