"""Eq. 4, the group advantage and the choice of memories, against hand-computed numbers."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from mia_engine.config.agent import RewardWeights
from mia_engine.agent.records import PlannerTexts, Rollout, Trajectory
from mia_engine.agent.rewards import (
    decision_reward,
    format_reward,
    group_advantages,
    rollout_reward,
    select_memories,
    supervised_reward,
    unsupervised_reward,
)
from mia_engine.agent.turns import ExecutorTurn
from mia_engine.agent.verdicts import Verdict
from mia_engine.memory.consolidation import should_store_meta_plan

W = RewardWeights()
PLAN = "<think>how to search</think>1. Search the title."


def _turn(text: str) -> ExecutorTurn:
    return ExecutorTurn(text, text, "t", None, "x", True)


def _rollout(is_correct: bool | None, num_turns: int = 1, *, reflection: str = "no", replan: str = "",
             first_correct: bool | None = None, source: str = "supervised", plan: str = PLAN,
             chars: int = 10) -> Rollout:
    turns = [_turn("x" * chars) for _ in range(num_turns)]
    trajectory = Trajectory(turns, [None] * num_turns, "a1", "a2", reflection, replan, bool(replan))
    verdict = None if is_correct is None else Verdict(is_correct, "A" if is_correct else "B", source)
    first = None if first_correct is None else Verdict(first_correct, "A" if first_correct else "B", source)
    return Rollout(plan, trajectory, verdict, first)


def test_format_reward():
    assert format_reward(PLAN, "no") == 1.0
    assert format_reward(PLAN, "<think>fine</think>\nyes", "<think>r</think>new plan") == 1.0
    assert format_reward(PLAN, "Yes, I would replan") == 0.0            # not exactly yes/no
    assert format_reward("<think>unclosed plan", "no") == 0.0            # plan's think unbalanced
    assert format_reward(PLAN, "yes", "<think>r new plan") == 0.0       # replan's think unbalanced
    assert format_reward(PLAN, "") == 0.0                               # reflection never ran


def test_rollout_format_reward_reads_the_raw_generations_not_the_stripped_plan():
    """The rollout keeps the plan's visible text (thinking stripped: always balanced); the format reward
    reads the raw generations the rollout recorded, where an unclosed think block fails it."""
    visible = "1. Search the title."
    raw = Rollout(visible, msgspec.structs.replace(_rollout(True).trajectory,
                                                   planner_texts=PlannerTexts("<think>how to search" + visible, "no")),
                  Verdict(True, "A", "supervised"))
    balanced = msgspec.structs.replace(raw, trajectory=msgspec.structs.replace(
        raw.trajectory, planner_texts=PlannerTexts("<think>how</think>" + visible, "no")))
    assert format_reward(visible, "no") == 1.0
    assert rollout_reward(balanced, W) - rollout_reward(raw, W) == pytest.approx(W.format)


def test_decision_reward():
    assert decision_reward(is_first_correct=True, did_replan=False) == 1.0
    assert decision_reward(is_first_correct=False, did_replan=True) == 1.0
    assert decision_reward(is_first_correct=True, did_replan=True) == 0.0
    assert decision_reward(is_first_correct=False, did_replan=False) == 0.0


def test_supervised_reward_is_eq4():
    assert supervised_reward(True, False, 1.0, 0.0, W) == pytest.approx(0.7 * 1 + 0.2 * 0 + 0.05 * 1 + 0.05 * 0)
    assert supervised_reward(True, True, 1.0, 1.0, W) == pytest.approx(0.7 + 0.2 + 0.05 + 0.05)
    assert supervised_reward(False, False, 0.0, 0.0, W) == 0.0
    custom = RewardWeights(final=1.0, first=0.0, format=0.0, decision=0.0)
    assert supervised_reward(True, False, 1.0, 1.0, custom) == 1.0


def test_unsupervised_reward():
    assert unsupervised_reward(True, 1.0, W) == pytest.approx(0.9 * 1 + 0.1 * 1)
    assert unsupervised_reward(False, 1.0, W) == pytest.approx(0.9 * 0 + 0.1 * 1)


def test_rollout_reward_cases():
    # replanned after a wrong first answer, then right: 0.7·1 + 0.2·0 + 0.05·1 + 0.05·1
    fixed = _rollout(True, reflection="yes", replan="<think>r</think>search X", first_correct=False)
    assert rollout_reward(fixed, W) == pytest.approx(0.7 * 1 + 0.2 * 0 + 0.05 * 1 + 0.05 * 1)
    # right the first time and stopped: the first verdict is the final one
    assert rollout_reward(_rollout(True, reflection="no"), W) == pytest.approx(0.7 + 0.2 + 0.05 + 0.05)
    # wrong and did not replan, reflection not exactly yes/no: nothing
    assert rollout_reward(_rollout(False, reflection="No, it is fine."), W) == pytest.approx(0.0)
    # unsupervised: 0.9·[correct] + 0.1·format
    assert rollout_reward(_rollout(True, source="unsupervised"), W) == pytest.approx(0.9 * 1 + 0.1 * 1)
    assert rollout_reward(_rollout(None), W) == 0.0


def test_group_advantages():
    rewards = [1.0, 0.0, 0.0, 0.0]
    mean = 0.25
    std = math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 4)  # population std
    expected = [(r - mean) / (std + 1e-6) for r in rewards]
    assert group_advantages(rewards, 1e-6) == pytest.approx(expected)
    assert group_advantages([0.95, 0.95, 0.95, 0.95], 1e-6) == [0.0, 0.0, 0.0, 0.0]
    assert group_advantages([], 1e-6) == []
    assert group_advantages([0.3], 1e-6) == [0.0]
    assert sum(group_advantages([0.1, 0.7, 0.95, 0.0], 1e-6)) == pytest.approx(0.0, abs=1e-9)


def test_group_advantages_hand_computed() -> None:
    # mean 0.5, population std sqrt(1/6) = 0.408248...
    assert group_advantages([0.0, 0.5, 1.0], eps=0.0) == pytest.approx([-1.2247449, 0.0, 1.2247449])
    # mean 0.5, std 0.5: ±0.5 / (0.5 + 0.5) with eps 0.5
    assert group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.5) == pytest.approx([0.5, -0.5, -0.5, 0.5])


@pytest.mark.parametrize("rewards", [[0.1, 0.1, 0.1], [0.95] * 3, [0.0, 0.0, 0.0, 0.0], [0.7], []])
def test_group_advantages_equal_rewards_are_exactly_zero(rewards: list[float]) -> None:
    """The loop's copy once left the mean's float noise over ε here (-1.4e-11 for [0.1] * 3, 1.1e-10 for
    [0.95] * 3) while the learner's gave zeros; there is one function now."""
    assert group_advantages(rewards, eps=1e-6) == [0.0] * len(rewards)


def test_select_memories_shortest_success_and_seeded_random_failure():
    long_ok, short_ok, short_ok_more_chars = _rollout(True, 3), _rollout(True, 1), _rollout(True, 1, chars=99)
    failures = [_rollout(False, 2, plan=f"fail {i}") for i in range(5)]
    group = [long_ok, *failures[:2], short_ok_more_chars, short_ok, *failures[2:]]
    positive, negative = select_memories(group, random.Random(7))
    assert positive is short_ok
    expected = random.Random(7).choice(failures)
    assert negative is expected
    assert select_memories(group, random.Random(7))[1] is negative  # same seed, same choice


def test_meta_plan_pair_only_when_both_outcomes_exist():
    all_ok = [_rollout(True), _rollout(True)]
    all_bad = [_rollout(False), _rollout(False)]
    mixed = [_rollout(True), _rollout(False)]
    assert select_memories(all_ok, random.Random(0))[1] is None
    assert select_memories(all_bad, random.Random(0))[0] is None
    assert not should_store_meta_plan(*select_memories(all_ok, random.Random(0)))
    assert not should_store_meta_plan(*select_memories(all_bad, random.Random(0)))
    assert should_store_meta_plan(*select_memories(mixed, random.Random(0)))
    assert select_memories([], random.Random(0)) == (None, None)
    garbage = Rollout(PLAN, _rollout(False).trajectory, Verdict(False, "B", "supervised", is_parsed=False))
    assert select_memories([_rollout(None), garbage], random.Random(0)) == (None, None)  # no usable label
