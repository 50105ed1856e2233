"""The rules of experience consolidation, as pure functions over entries and rollouts.

Kept apart from the store so each rule (replacement, which rollouts to keep, what to clear) is
testable without disk, FAISS or an encoder.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ..config.memory import ClearPolicy
from .entries import MemoryEntry


def should_replace(existing: MemoryEntry, new: MemoryEntry) -> bool:
    """Reference rule for a same-label duplicate: a failure lesson is always refreshed (the newer
    one reflects the current Planner); a success is only replaced by a shorter, i.e. cheaper, workflow."""
    if not existing.is_correct:
        return True
    return len(new.workflow_summary) < len(existing.workflow_summary)


class Candidate(Protocol):
    """What the selection reads of a rollout: the judge's verdict and a comparable trajectory length
    (``entries.SummarisedRollout``: an int; the research loop's rollouts: (turns, characters))."""

    @property
    def is_correct(self) -> bool: ...

    @property
    def length(self) -> Any: ...


C = TypeVar("C", bound=Candidate)


def choose_rollouts(rollouts: Sequence[C], rng: random.Random) -> tuple[C | None, C | None]:
    """(positive, negative) of TTL step 6 (MIA algorithm 3): the shortest success (smallest ``length``, the
    first among equals) and one failure picked by ``rng``; either may be None.

    The research loop picks with it (``agent.rewards.select_memories``) before the Manager summarises
    the two, and ``MemoryService.consolidate_group`` stores what it picked."""
    successes = [rollout for rollout in rollouts if rollout.is_correct]
    failures = [rollout for rollout in rollouts if not rollout.is_correct]
    positive = min(successes, key=lambda rollout: rollout.length) if successes else None
    negative = rng.choice(failures) if failures else None
    return positive, negative


def should_store_meta_plan(positive: object | None, negative: object | None) -> bool:
    """A (successful plan, failed plan) Meta Plan pair is stored only when the group has both outcomes."""
    return positive is not None and negative is not None


def entries_to_clear(
    entries: Iterable[MemoryEntry],
    policy: ClearPolicy,
    *,
    max_num_entries: int,
    last_clear_at: float | None,
) -> list[str]:
    """Ids the selective clearing after a learning update removes, so the buffer does not saturate."""
    if policy == "drop_unused":
        return _unused_since(entries, last_clear_at)
    if policy == "cap":
        return _beyond_capacity(entries, max_num_entries)
    return []


def _unused_since(entries: Iterable[MemoryEntry], last_clear_at: float | None) -> list[str]:
    """Never-retrieved memories that already had one full update to prove useful; fresh ones stay."""
    if last_clear_at is None:
        return []
    return [entry.id for entry in entries if entry.num_uses == 0 and entry.created_at <= last_clear_at]


def _beyond_capacity(entries: Iterable[MemoryEntry], max_num_entries: int) -> list[str]:
    """Keep the best by Val = s / (u + 1); among equals the newer (fresh memories have Val 0)."""
    def value_then_age(entry: MemoryEntry) -> tuple[float, float]:
        return entry.num_successes / (entry.num_uses + 1), entry.created_at

    ranked = sorted(entries, key=value_then_age, reverse=True)
    return [entry.id for entry in ranked[max_num_entries:]]
