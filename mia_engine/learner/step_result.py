"""What one GRPO step of the Planner's learner did (``StepResult``), and the totals it is built from."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import msgspec
import torch

TOKEN_STATS = ("clip_fraction", "ratio_mean", "kl")
"""The per-token statistics ``grpo_loss`` reports, averaged over a step's contributing tokens."""


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``step`` did; ``is_accepted`` False means the adapter is exactly as before."""

    is_accepted: bool
    reason: str
    """Why the step was rejected (or skipped); empty when accepted."""
    loss: float
    """Full-batch loss of the first epoch (before any update in this step)."""
    grad_norm: float
    """Global gradient norm of the first epoch, before clipping."""
    num_sequences: int
    """Sequences that contributed (groups with a reward spread, at least one Planner token)."""
    num_tokens: int
    """Planner tokens that contributed."""
    reward_mean: float
    reward_std: float
    clip_fraction: float
    """Share of contributing tokens whose clipped term was the minimum (no gradient), first epoch."""
    ratio_mean: float
    kl: float
    """Mean k3 KL to the adapter-free model (0 unless ``kl_beta`` > 0)."""
    num_skipped_groups: int
    """Groups whose rewards were all equal (zero advantage)."""
    num_skipped_long: int = 0
    """Rollouts left out for being longer than ``max_seq_len``."""
    num_skipped_stale: int = 0
    """Rollouts left out for being sampled more than ``max_sample_staleness`` versions ago."""
    num_sampler_tokens: int = 0
    """Contributing tokens whose old log-prob came from the sampling engine (the rest: the learner's own)."""
    sampler_gap_mean: float = math.nan
    """Mean |learner log-prob − sampler log-prob| over those tokens before the update (first epoch): how
    far the learner's policy is from the one that sampled (numerics, staleness); NaN without any."""
    sampler_gap_max: float = math.nan
    """The largest such gap."""
    step_seconds: float
    version: int
    """The learner's version after the step; incremented on each accepted step, never decremented."""


@dataclass
class StepTotals:
    """Totals of one accumulation pass over all micro-batches."""

    loss: float = 0.0
    num_tokens: int = 0
    token_stats: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TOKEN_STATS, 0.0))
    failure: str = ""
    num_sampler_tokens: int = 0
    sampler_gap_sum: float = 0.0
    sampler_gap_max: float = math.nan

    def add(self, loss: float, num_tokens: int, stats: dict[str, float]) -> None:
        self.loss += loss
        self.num_tokens += num_tokens
        for name in self.token_stats:
            self.token_stats[name] += stats[name] * num_tokens

    def add_gaps(self, gaps: torch.Tensor) -> None:
        """|learner − sampler| log-probs of some contributing tokens, (n,)."""
        if gaps.numel():
            self.num_sampler_tokens += gaps.numel()
            self.sampler_gap_sum += float(gaps.sum())
            self.sampler_gap_max = max(float(gaps.max()), 0.0 if math.isnan(self.sampler_gap_max)
                                       else self.sampler_gap_max)

    def mean(self, name: str) -> float:
        return self.token_stats[name] / max(self.num_tokens, 1)


class StepSummary:
    """Collects the numbers of a step and builds its StepResult."""

    def __init__(self, rewards: torch.Tensor, started: float) -> None:
        self.started = started
        self.reward_mean = float(rewards.mean()) if rewards.numel() else math.nan
        self.reward_std = float(rewards.std(unbiased=False)) if rewards.numel() else math.nan
        self.num_skipped_groups = 0
        self.num_skipped_long = 0
        self.num_skipped_stale = 0
        self.totals = StepTotals()
        self.num_sequences = 0
        self.grad_norm = math.nan

    def record(self, totals: StepTotals, grad_norm: float) -> None:
        self.totals, self.grad_norm = totals, grad_norm

    def accepted(self, version: int) -> StepResult:
        return self._result(True, "", version)

    def rejected(self, reason: str, version: int) -> StepResult:
        return self._result(False, reason, version)

    def _result(self, is_accepted: bool, reason: str, version: int) -> StepResult:
        t = self.totals
        return StepResult(
            is_accepted=is_accepted, reason=reason, loss=t.loss if t.num_tokens else math.nan,
            grad_norm=self.grad_norm, num_sequences=self.num_sequences, num_tokens=t.num_tokens,
            reward_mean=self.reward_mean, reward_std=self.reward_std, clip_fraction=t.mean("clip_fraction"),
            ratio_mean=t.mean("ratio_mean"), kl=t.mean("kl"), num_skipped_groups=self.num_skipped_groups,
            num_skipped_long=self.num_skipped_long, num_skipped_stale=self.num_skipped_stale,
            num_sampler_tokens=t.num_sampler_tokens, sampler_gap_max=t.sampler_gap_max,
            sampler_gap_mean=t.sampler_gap_sum / t.num_sampler_tokens if t.num_sampler_tokens else math.nan,
            step_seconds=time.perf_counter() - self.started, version=version)
