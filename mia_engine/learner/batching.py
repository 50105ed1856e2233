"""Batching for the Planner's learner: judged rollouts → prepared sequences → padded micro-batches.

``GRPOSample`` is what the learner takes. ``check_samples`` rejects malformed ones, ``drop_stale`` leaves
out those sampled too many adapter versions ago, ``prepare`` computes group advantages and each
sequence's Planner-token mask (dropping groups with no reward spread and sequences with no Planner
token), ``drop_long`` leaves out over-long ones, and ``micro_batches`` sorts them by length and
right-pads them into the tensors of one forward pass each, with where each span sampled under a regex
lies (``GrammarRun``). No model and no optimizer here: ``learner.PlannerLearner`` takes the GRPO step on
these batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import torch

from ..agent.rewards import group_advantages
from .grpo import TokenMask


class GrammarSpan(msgspec.Struct, frozen=True):
    """Completion tokens ``[start, end)`` that the sampling engine drew under structured outputs: ``regex``
    masked the logits at each of them (the learner scores them under the same mask)."""

    start: int
    end: int
    regex: str


class GRPOSample(msgspec.Struct, frozen=True, kw_only=True):
    """One rollout of the Planner as the learner sees it: token ids, which tokens it wrote, its reward."""

    prompt_ids: list[int]
    """The Planner's prompt (question, retrieved memories, ...); never trained on. Must not be empty."""
    completion_ids: list[int]
    """Everything after the prompt, in order."""
    completion_mask: list[int] | None = None
    """1 = a token the Planner sampled (plan, reflection, replan), 0 = anything else spliced in (executor
    text, tool output, memories). None = every completion token is the Planner's."""
    reward: float
    """The rollout's reward (MIA Eq. 4)."""
    old_logprobs: list[float] | None = None
    """Per completion token, its log-prob under the policy that sampled it (the engine's sampler, after
    any structured-output mask), the old policy of the ratio; NaN for a token without one and None for
    all: there the learner's own detached log-probs before the update stand in (ratio 1 at the first
    epoch, the on-policy case)."""
    grammar_spans: list[GrammarSpan] = []
    """The completion's spans sampled under a regex (none: every token was sampled freely)."""
    policy_version: int | None = None
    """The Planner adapter version that sampled it (the adapter registry's number); None = unknown, never
    counted stale (``LearnerConfig.max_sample_staleness``)."""
    group_id: str
    """Rollouts of the same question share it; advantages are computed within a group."""


@dataclass(frozen=True)
class PreparedSequence:
    """A prepared sample: the full token list and where its loss lives."""

    token_ids: list[int]
    prompt_len: int
    mask: list[float]
    old_logprobs: list[float] | None
    advantage: float
    grammar_spans: list[GrammarSpan]


@dataclass(frozen=True)
class GrammarRun:
    """A span sampled under ``regex``, in one micro-batch: tokens ``input_ids[seq, first:first + length]``,
    scored at the flattened rows ``row..row + length - 1`` of its (b, K-1) log-probs."""

    seq: int
    first: int
    length: int
    row: int
    regex: str


@dataclass
class MicroBatch:
    """Padded tensors of one forward pass; right padding, loss positions shifted by one."""

    input_ids: torch.Tensor  # (b, T)
    attention_mask: torch.Tensor  # (b, T)
    loss_mask: torch.Tensor  # (b, T-1), float
    old_logp: torch.Tensor  # (b, T-1), float32; NaN where the sample gave none
    advantages: torch.Tensor  # (b,)
    start: int  # first position whose logits are needed (min prompt length − 1)
    grammar_runs: list[GrammarRun]  # spans sampled under a regex
    token_mask: TokenMask | None = None  # their grammar masks, built by the learner on first use


def check_samples(samples: list[GRPOSample], vocab_size: int) -> None:
    """Malformed input is a caller bug: raise rather than train on misaligned tokens."""
    if not samples:
        raise ValueError("step() needs at least one sample")
    for i, s in enumerate(samples):
        n = len(s.completion_ids)
        if not s.prompt_ids:
            raise ValueError(f"sample {i}: prompt_ids is empty (the first token has no log-prob)")
        if s.completion_mask is not None and len(s.completion_mask) != n:
            raise ValueError(f"sample {i}: completion_mask has {len(s.completion_mask)} entries for {n} tokens")
        if s.old_logprobs is not None and len(s.old_logprobs) != n:
            raise ValueError(f"sample {i}: old_logprobs has {len(s.old_logprobs)} entries for {n} tokens")
        if any(not 0 <= span.start < span.end <= n for span in s.grammar_spans):
            raise ValueError(f"sample {i}: a grammar span lies outside its {n} completion tokens")
        ids = s.prompt_ids + s.completion_ids
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(f"sample {i}: token id outside the vocabulary (0..{vocab_size - 1})")


def drop_stale(samples: list[GRPOSample], version: int | None,
               max_staleness: int) -> tuple[list[GRPOSample], int]:
    """Samples whose ``policy_version`` is at most ``max_staleness`` versions behind ``version`` (the one
    serving now; None = unknown, nothing dropped), and how many were left out."""
    if version is None:
        return samples, 0
    kept = [s for s in samples if s.policy_version is None or version - s.policy_version <= max_staleness]
    return kept, len(samples) - len(kept)


def prepare(samples: list[GRPOSample], eps: float) -> tuple[list[PreparedSequence], int]:
    """Group advantages; drop zero-advantage groups and sequences with no Planner token."""
    groups: dict[str, list[GRPOSample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_id, []).append(sample)
    sequences, num_skipped = [], 0
    for members in groups.values():
        advantages = group_advantages([s.reward for s in members], eps)  # (G,)
        if not any(advantages):
            num_skipped += 1
            continue
        sequences += [seq for s, a in zip(members, advantages) if (seq := _sequence(s, a)) is not None]
    return sequences, num_skipped


def drop_long(sequences: list[PreparedSequence], max_len: int) -> tuple[list[PreparedSequence], int]:
    """Sequences within ``max_len`` tokens (0 = no limit), and how many were left out."""
    kept = [s for s in sequences if not max_len or len(s.token_ids) <= max_len]
    return kept, len(sequences) - len(kept)


def micro_batches(sequences: list[PreparedSequence], size: int, pad_id: int,
                  device: torch.device) -> list[MicroBatch]:
    """Sequences sorted by length (less padding), cut into micro-batches of ``size``."""
    ordered = sorted(sequences, key=lambda s: len(s.token_ids), reverse=True)
    return [_collate(ordered[i:i + size], pad_id, device) for i in range(0, len(ordered), size)]


def _sequence(sample: GRPOSample, advantage: float) -> PreparedSequence | None:
    mask = ([1.0] * len(sample.completion_ids) if sample.completion_mask is None
            else [1.0 if m else 0.0 for m in sample.completion_mask])
    if not any(mask):
        return None
    return PreparedSequence(sample.prompt_ids + sample.completion_ids, len(sample.prompt_ids), mask,
                            sample.old_logprobs, advantage, list(sample.grammar_spans))


def _collate(sequences: list[PreparedSequence], pad_id: int, device: torch.device) -> MicroBatch:
    """Right-pad; completion token j of a sequence with prompt length P is scored at position P − 1 + j."""
    b, t = len(sequences), max(len(s.token_ids) for s in sequences)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)  # (b, T)
    attention_mask = torch.zeros((b, t), dtype=torch.long)  # (b, T)
    loss_mask = torch.zeros((b, t - 1), dtype=torch.float32)  # (b, T-1)
    old_logp = torch.full((b, t - 1), float("nan"), dtype=torch.float32)  # (b, T-1)
    for i, s in enumerate(sequences):
        n, first = len(s.token_ids), s.prompt_len - 1
        input_ids[i, :n] = torch.tensor(s.token_ids)
        attention_mask[i, :n] = 1
        loss_mask[i, first:n - 1] = torch.tensor(s.mask)
        if s.old_logprobs is not None:
            old_logp[i, first:n - 1] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in sequences], dtype=torch.float32)  # (b,)
    start = min(s.prompt_len for s in sequences) - 1
    return MicroBatch(input_ids.to(device), attention_mask.to(device), loss_mask.to(device),
                      old_logp.to(device), advantages.to(device), start, _grammar_runs(sequences, t, start))


def _grammar_runs(sequences: list[PreparedSequence], t: int, start: int) -> list[GrammarRun]:
    """Where each grammar span's tokens lie: completion token j of sequence i is ``input_ids[i, P + j]``,
    scored at position P − 1 + j, which is row i·(T − 1 − start) + P − 1 + j − start of the flattened
    (b, K-1) log-probs."""
    width = t - 1 - start
    return [GrammarRun(i, s.prompt_len + span.start, span.end - span.start,
                       i * width + s.prompt_len - 1 + span.start - start, span.regex)
            for i, s in enumerate(sequences) for span in s.grammar_spans]
