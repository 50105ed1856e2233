"""Consolidation rules (pure logic) and TTL step 6 through the service with the real encoder."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from mia_engine.memory.consolidation import choose_rollouts, entries_to_clear, should_replace
from mia_engine.memory.embedder import Embedder
from mia_engine.memory.entries import SummarisedRollout
from mia_engine.memory.service import MemoryService

from .factories import make_entry, memory_config, unit


def _rollout(plan: str, is_correct: bool, length: int) -> SummarisedRollout:
    return SummarisedRollout(plan, f"summary of {plan}", is_correct, length, trajectory=f"trace {plan}")


GROUP = [
    _rollout("long success", True, 40),
    _rollout("fail a", False, 10),
    _rollout("short success", True, 12),
    _rollout("fail b", False, 30),
]
CHOSEN = choose_rollouts(GROUP, random.Random(3))
"""What the research loop hands the service for GROUP: (shortest success, one failure)."""


def test_choose_rollouts_takes_the_shortest_success_and_a_seeded_random_failure() -> None:
    picks = {choose_rollouts(GROUP, random.Random(seed))[1].plan for seed in range(20)}
    assert picks == {"fail a", "fail b"}
    positive, negative = choose_rollouts(GROUP, random.Random(7))
    assert positive.plan == "short success"
    assert choose_rollouts(GROUP, random.Random(7))[1] == negative  # same seed, same pick


def test_choose_rollouts_with_one_outcome_only() -> None:
    assert choose_rollouts([r for r in GROUP if r.is_correct], random.Random(0))[1] is None
    assert choose_rollouts([r for r in GROUP if not r.is_correct], random.Random(0))[0] is None
    assert choose_rollouts([], random.Random(0)) == (None, None)


def test_should_replace_rule() -> None:
    key = unit(np.random.default_rng(0))
    correct_long, correct_short = make_entry(key, summary="abcdef"), make_entry(key, summary="abc")
    assert should_replace(correct_long, correct_short) and not should_replace(correct_short, correct_long)
    assert not should_replace(correct_short, make_entry(key, summary="xyz"))  # equal length keeps the old one
    wrong = make_entry(key, label="incorrect", summary="a")
    assert should_replace(wrong, make_entry(key, label="incorrect", summary="a much longer one"))


def test_entries_to_clear_policies() -> None:
    rng = np.random.default_rng(1)
    old_unused = make_entry(unit(rng), created_at=1.0)
    old_used = make_entry(unit(rng), created_at=1.0, num_uses=2, num_successes=1)
    new_unused = make_entry(unit(rng), created_at=5.0)
    entries = [old_unused, old_used, new_unused]
    assert entries_to_clear(entries, "none", max_num_entries=0, last_clear_at=3.0) == []
    assert entries_to_clear(entries, "drop_unused", max_num_entries=0, last_clear_at=3.0) == [old_unused.id]
    assert entries_to_clear(entries, "drop_unused", max_num_entries=0, last_clear_at=None) == []
    assert entries_to_clear(entries, "cap", max_num_entries=2, last_clear_at=None) == [old_unused.id]


@pytest.fixture()
async def service(tmp_path: Path, embedder: Embedder) -> AsyncIterator[MemoryService]:
    memory = await MemoryService.open(tmp_path, memory_config(), encoder=embedder)
    yield memory
    await memory.close()


async def test_consolidate_group_stores_positive_negative_and_meta_plan(service: MemoryService) -> None:
    question = "Which river flows through Vienna?"
    result = await service.consolidate_group(question, CHOSEN, category="location")
    positive, negative = await service.get(result.positive.id), await service.get(result.negative.id)
    assert (positive.plan, positive.label, positive.trajectory) == ("short success", "correct", "trace short success")
    assert negative.label == "incorrect" and negative.plan in {"fail a", "fail b"}
    assert positive.category == negative.category == "location" and positive.modality == "text"
    pairs = await service.search_meta_plans("What river runs through Vienna?")
    assert [(hit.pair.id, hit.pair.successful_plan, hit.pair.failed_plan) for hit in pairs] == [
        (result.meta_plan_id, "short success", negative.plan)
    ]
    assert pairs[0].similarity > 0.8


async def test_consolidate_group_without_both_outcomes_stores_no_pair(service: MemoryService) -> None:
    only_success = await service.consolidate_group("q one", (CHOSEN[0], None))
    only_failure = await service.consolidate_group("q two", (None, CHOSEN[1]), caption="a map")
    assert only_success.positive is not None and only_success.negative is None and only_success.meta_plan_id is None
    assert only_failure.positive is None and only_failure.negative is not None and only_failure.meta_plan_id is None
    assert (await service.get(only_failure.negative.id)).modality == "text_image"
    assert (await service.stats()).num_meta_plans == 0
    assert await service.consolidate_group("q three", (None, None)) == type(only_success)()
    with pytest.raises(ValueError, match="successful rollout, a failed rollout"):
        await service.consolidate_group("q four", (CHOSEN[1], CHOSEN[0]))  # the order is (success, failure)


async def test_record_outcome_and_clear_through_the_service(service: MemoryService) -> None:
    result = await service.consolidate_group("Who discovered penicillin?", CHOSEN)
    hits = await service.search("Who found penicillin?")
    used = [hit.entry.id for hit in hits.positives + hits.negatives]
    assert sorted(used) == sorted([result.positive.id, result.negative.id])
    assert await service.record_outcome(used, True) == 2
    assert (await service.get(result.positive.id)).num_successes == 1
    assert (await service.clear_after_update()).removed_ids == []  # the default policy keeps all
