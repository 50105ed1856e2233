"""The GRPO objective in plain torch: token log-probs and the clipped surrogate loss (the group advantages
it weighs are ``agent.rewards.group_advantages``, the same numbers the loop reports).

Shapes: B sequences, T tokens per (padded) sequence, V vocabulary entries. Log-probs live on the T − 1
"next token" positions: position t scores token t + 1 given tokens 0..t.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["grpo", "dapo"]


def sequence_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log π(token_{t+1} | tokens_≤t) of every next token, at the sampling temperature.

    Equal to ``log_softmax(logits[:, :-1] / temperature).gather(input_ids[:, 1:])``, computed as the
    gathered logit minus the logsumexp so no second (B, T, V) tensor is kept for backward. Float32
    throughout: bf16 log-probs are too coarse for ratios near 1.
    """
    scaled = logits[:, :-1].float() / temperature  # (B, T-1, V)
    targets = input_ids[:, 1:].unsqueeze(-1)  # (B, T-1, 1)
    token_logits = scaled.gather(-1, targets).squeeze(-1)  # (B, T-1)
    return token_logits - torch.logsumexp(scaled, dim=-1)  # (B, T-1)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    clip_eps_high: float | None,
    aggregation: Aggregation,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO surrogate, to minimise.

    logp, old_logp, ref_logp, mask: (B, T-1); advantages: (B,). Per token:
    −min(r·A, clip(r, 1 − ε, 1 + ε_high)·A) + β·KL₃ with r = exp(logp − old_logp) and
    KL₃ = exp(ref − logp) − (ref − logp) − 1. Inactive tokens (mask 0) may hold any value in old_logp
    and ref_logp, even ±inf: they are excluded before exponentiation, not multiplied by zero afterwards.

    ``normalizer`` replaces the batch's own denominator (B for "grpo", active tokens for "dapo") so that
    micro-batch losses sum to the full-batch loss; stats are means over this batch's active tokens.
    """
    active = mask > 0  # (B, T-1)
    maskf = active.to(logp.dtype)
    log_ratio = torch.where(active, logp - old_logp, torch.zeros_like(logp))  # (B, T-1)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)  # (B, T-1)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        ref_diff = torch.where(active, ref_logp - logp, torch.zeros_like(logp))  # (B, T-1)
        kl = torch.exp(ref_diff) - ref_diff - 1.0
        if kl_beta > 0:
            per_token = per_token + kl_beta * kl
    loss = _aggregate(torch.where(active, per_token, torch.zeros_like(per_token)), maskf, aggregation, normalizer)
    is_clipped = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))  # (B, T-1)
    return loss, _token_means(maskf, clip_fraction=is_clipped, ratio_mean=ratio, kl=kl)


def _aggregate(per_token: torch.Tensor, maskf: torch.Tensor, aggregation: Aggregation,
               normalizer: float | None) -> torch.Tensor:
    """Masked reduction of (B, T-1) per-token losses to a scalar."""
    if aggregation == "grpo":
        seq_means = per_token.sum(-1) / maskf.sum(-1).clamp(min=1.0)  # (B,)
        return seq_means.sum() / (per_token.shape[0] if normalizer is None else normalizer)
    if aggregation == "dapo":
        denom = maskf.sum().clamp(min=1.0) if normalizer is None else normalizer
        return per_token.sum() / denom
    raise ValueError(f"unknown aggregation {aggregation!r} (expected 'grpo' or 'dapo')")


def _token_means(maskf: torch.Tensor, **values: torch.Tensor) -> dict[str, float]:
    """Mean of each (B, T-1) tensor over the active tokens, as floats for logging."""
    num_active = float(maskf.sum())
    with torch.no_grad():
        return {name: float((value.to(maskf.dtype) * maskf).sum()) / max(num_active, 1.0)
                for name, value in values.items()}
