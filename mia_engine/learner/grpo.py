"""The GRPO objective in plain torch: token log-probs and the clipped surrogate loss (the group advantages
it weighs are ``agent.rewards.group_advantages``, the same numbers the loop reports).

Shapes: B sequences, T tokens per (padded) sequence, V vocabulary entries, H hidden size. Log-probs
live on the T − 1 "next token" positions: position t scores token t + 1 given tokens 0..t.

``chunked_token_logprobs`` is what the learner runs: a fused linear + log-softmax over the final hidden
states, a chunk of positions at a time, so the (B, T, V) logits never exist. ``sequence_token_logprobs``
is its reference, on logits the model has already computed.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

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


def chunked_token_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                           temperature: float, chunk_size: int) -> torch.Tensor:
    """log π(target_n | hidden_n) per row, ``chunk_size`` rows' logits at a time; exact, not approximate.

    hidden: (N, H) final hidden states (after the last norm); targets: (N,) token ids; ``head`` maps
    (n, H) to (n, V) logits (the model's output embedding, LoRA included if it has one). Returns (N,)
    float32. At most one chunk's (chunk_size, V) logits and their float32 copies exist at a time:

    - a frozen ``nn.Linear`` head (the usual case): each chunk's log-probs and their gradient with
      respect to its hidden states, ((onehot − softmax) @ W) / temperature, an (n, H) row each, are
      computed together; the backward scales those rows, so the logits are made once and never kept.
    - any other head (a LoRA on it, a trainable head): each chunk is checkpointed (non-reentrant), and
      the backward recomputes its logits; autograd then reaches the head's own weights.
    """
    is_trainable = any(p.requires_grad for p in head.parameters())
    if not torch.is_grad_enabled() or not (hidden.requires_grad or is_trainable):
        with torch.no_grad():
            return torch.cat([_chunk_logprobs(h, t, head, temperature)
                              for h, t in zip(hidden.split(chunk_size), targets.split(chunk_size))])
    if isinstance(head, torch.nn.Linear) and not is_trainable:
        return _FusedLinearLogprobs.apply(hidden, targets, head, temperature, chunk_size)
    return torch.cat([checkpoint(_chunk_logprobs, h, t, head, temperature, use_reentrant=False)
                      for h, t in zip(hidden.split(chunk_size), targets.split(chunk_size))])


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    """Gathered logit minus logsumexp of one chunk, in float32 (bf16 is too coarse for ratios near 1)."""
    scaled = head(hidden).float()  # (n, V); the model-dtype logits are freed once copied
    if temperature != 1.0:
        scaled = scaled.div_(temperature)  # in place: no third (n, V) tensor
    token_logits = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (n,)
    return token_logits - torch.logsumexp(scaled, dim=-1)  # (n,)


class _FusedLinearLogprobs(torch.autograd.Function):
    """Log-probs through a frozen linear head and their per-row gradient, one chunk of logits at a time.

    logp_n depends on hidden_n alone, so d logp_n / d hidden_n is one (H,) row: the backward needs only
    those rows (N, H), not the (N, V) logits."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear,  # type: ignore[override]
                temperature: float, chunk_size: int) -> torch.Tensor:
        parts = [_chunk_logprobs_and_rows(h, t, head, temperature)
                 for h, t in zip(hidden.split(chunk_size), targets.split(chunk_size))]
        ctx.hidden_dtype = hidden.dtype
        ctx.save_for_backward(torch.cat([rows for _, rows in parts]))  # (N, H)
        return torch.cat([logp for logp, _ in parts])  # (N,)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        (rows,) = ctx.saved_tensors  # (N, H)
        return (grad.unsqueeze(-1) * rows).to(ctx.hidden_dtype), None, None, None, None


def _chunk_logprobs_and_rows(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear,
                             temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) float32 log-probs of one chunk and (n, H) d logp / d hidden = ((onehot − p) @ W) / temperature."""
    scaled = head(hidden).float()  # (n, V)
    if temperature != 1.0:
        scaled = scaled.div_(temperature)
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)  # (n, 1)
    index = targets.unsqueeze(-1)  # (n, 1)
    logp = (scaled.gather(-1, index) - lse).squeeze(-1)  # (n,)
    delta = scaled.sub_(lse).exp_().mul_(-1.0 / temperature)  # (n, V): −softmax / temperature, in place
    delta.scatter_add_(-1, index, torch.full_like(lse, 1.0 / temperature))  # (onehot − softmax) / temperature
    weight = head.weight  # (V, H)
    return logp, delta.to(weight.dtype) @ weight  # (n,), (n, H)


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
