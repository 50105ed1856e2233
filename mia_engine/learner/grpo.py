"""The GRPO objective in plain torch: token log-probs and the clipped surrogate loss (the group advantages
it weighs are ``agent.rewards.group_advantages``, the same numbers the loop reports).

Shapes: B sequences, T tokens per (padded) sequence, V vocabulary entries, H hidden size. Log-probs
live on the T − 1 "next token" positions: position t scores token t + 1 given tokens 0..t.

``chunked_token_logprobs`` is what the learner runs: a fused linear + log-softmax over the final hidden
states, a chunk of positions at a time, so the (B, T, V) logits never exist. ``sequence_token_logprobs``
is its reference, on logits the model has already computed.

A token sampled under structured outputs (a regex) was drawn from the policy restricted to the tokens the
grammar allowed at its position: vLLM applies the grammar's bitmask to the logits (−inf outside) before
its sampler, and its returned log-probs are those of the masked logits. ``TokenMask`` gives the learner
the same bitmask for such positions (``grammar_mask``), so its log-probs are those of the same policy.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

Aggregation = Literal["grpo", "dapo"]


class TokenMask(NamedTuple):
    """The tokens allowed at some rows of a (N, V) logits matrix; rows not listed allow every token.

    rows: (M,) long, ascending, distinct; bitmask: (M, ⌈V/32⌉) int32 in xgrammar's packed layout (bit j
    of word w set = token 32·w + j allowed), as ``xgrammar.GrammarMatcher.fill_next_token_bitmask``
    writes it and vLLM applies it."""

    rows: torch.Tensor
    bitmask: torch.Tensor


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(M, W) packed int32 → (M, vocab_size) bool, True = allowed (bits past the vocabulary dropped).

    Unpacked a byte at a time (a little-endian word's byte k holds tokens 32·w + 8·k ..), so the largest
    temporary is one byte per entry, not an int32."""
    packed = bitmask.contiguous().view(torch.uint8)  # (M, 4W), little-endian bytes of each word
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmask.device)  # (8,)
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # (M, 4W, 8) uint8
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def masked_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` with −inf where ``allowed`` is False (a new tensor; the reference of the fused path)."""
    return logits.masked_fill(~allowed, float("-inf"))


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
                           temperature: float, chunk_size: int, mask: TokenMask | None = None) -> torch.Tensor:
    """log π(target_n | hidden_n) per row, ``chunk_size`` rows' logits at a time; exact, not approximate.

    hidden: (N, H) final hidden states (after the last norm); targets: (N,) token ids; ``head`` maps
    (n, H) to (n, V) logits (the model's output embedding, LoRA included if it has one). Returns (N,)
    float32. At most one chunk's (chunk_size, V) logits and their float32 copies exist at a time:

    - a frozen ``nn.Linear`` head (the usual case): each chunk's log-probs and their gradient with
      respect to its hidden states, ((onehot − softmax) @ W) / temperature, an (n, H) row each, are
      computed together; the backward scales those rows, so the logits are made once and never kept.
    - any other head (a LoRA on it, a trainable head): each chunk is checkpointed (non-reentrant), and
      the backward recomputes its logits; autograd then reaches the head's own weights.

    ``mask``: rows scored under a grammar; their disallowed logits are −inf before the log-softmax (and
    take no gradient), as in the sampler that drew them.
    """
    is_trainable = any(p.requires_grad for p in head.parameters())
    chunks = list(zip(hidden.split(chunk_size), targets.split(chunk_size), _chunk_masks(mask, len(targets), chunk_size)))
    if not torch.is_grad_enabled() or not (hidden.requires_grad or is_trainable):
        with torch.no_grad():
            return torch.cat([_chunk_logprobs(h, t, head, temperature, m) for h, t, m in chunks])
    if isinstance(head, torch.nn.Linear) and not is_trainable:
        return _FusedLinearLogprobs.apply(hidden, targets, head, temperature, chunk_size, mask)
    return torch.cat([checkpoint(_chunk_logprobs, h, t, head, temperature, m, use_reentrant=False)
                      for h, t, m in chunks])


def _chunk_masks(mask: TokenMask | None, num_rows: int, chunk_size: int) -> list[TokenMask | None]:
    """``mask`` cut along the chunks of ``num_rows`` rows, each chunk's rows relative to its first."""
    num_chunks = -(-num_rows // chunk_size)
    if mask is None or not len(mask.rows):
        return [None] * num_chunks
    bounds = torch.arange(num_chunks + 1, device=mask.rows.device) * chunk_size  # (C+1,)
    cuts = torch.searchsorted(mask.rows, bounds).tolist()
    return [TokenMask(mask.rows[a:b] - c * chunk_size, mask.bitmask[a:b]) if b > a else None
            for c, (a, b) in enumerate(zip(cuts, cuts[1:]))]


def _scaled_logits(hidden: torch.Tensor, head: torch.nn.Module, temperature: float,
                   mask: TokenMask | None) -> torch.Tensor:
    """(n, V) float32 logits / temperature of one chunk, −inf where its mask disallows a token."""
    scaled = head(hidden).float()  # (n, V); the model-dtype logits are freed once copied
    if temperature != 1.0:
        scaled = scaled.div_(temperature)  # in place: no third (n, V) tensor
    if mask is not None:
        allowed = unpack_bitmask(mask.bitmask, scaled.shape[-1])  # (m, V)
        scaled = scaled.index_put((mask.rows,), masked_logits(scaled[mask.rows], allowed))
    return scaled


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float, mask: TokenMask | None = None) -> torch.Tensor:
    """Gathered logit minus logsumexp of one chunk, in float32 (bf16 is too coarse for ratios near 1)."""
    scaled = _scaled_logits(hidden, head, temperature, mask)  # (n, V)
    token_logits = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (n,)
    return token_logits - torch.logsumexp(scaled, dim=-1)  # (n,)


class _FusedLinearLogprobs(torch.autograd.Function):
    """Log-probs through a frozen linear head and their per-row gradient, one chunk of logits at a time.

    logp_n depends on hidden_n alone, so d logp_n / d hidden_n is one (H,) row: the backward needs only
    those rows (N, H), not the (N, V) logits."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear,  # type: ignore[override]
                temperature: float, chunk_size: int, mask: TokenMask | None) -> torch.Tensor:
        parts = [_chunk_logprobs_and_rows(h, t, head, temperature, m)
                 for h, t, m in zip(hidden.split(chunk_size), targets.split(chunk_size),
                                    _chunk_masks(mask, len(targets), chunk_size))]
        ctx.hidden_dtype = hidden.dtype
        ctx.save_for_backward(torch.cat([rows for _, rows in parts]))  # (N, H)
        return torch.cat([logp for logp, _ in parts])  # (N,)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        (rows,) = ctx.saved_tensors  # (N, H)
        return (grad.unsqueeze(-1) * rows).to(ctx.hidden_dtype), None, None, None, None, None


def _chunk_logprobs_and_rows(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear,
                             temperature: float, mask: TokenMask | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) float32 log-probs of one chunk and (n, H) d logp / d hidden = ((onehot − p) @ W) / temperature
    (a masked-out token has p = 0)."""
    scaled = _scaled_logits(hidden, head, temperature, mask)  # (n, V)
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
