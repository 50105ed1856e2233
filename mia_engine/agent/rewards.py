"""The Planner's reward (Eq. 4, as the reference code computes it), the group advantage, and which
rollouts become memories (test-time learning steps 4-6).

Pure functions over numbers and rollouts, so each rule is checked against hand-computed cases.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from ..memory.consolidation import choose_rollouts
from ..config.agent import RewardWeights
from .model_text import is_think_balanced
from .plan_decisions import is_exact_yes_no
from .records import Rollout


def format_reward(plan: str, reflection: str, replan: str = "") -> float:
    """1 when the reflection is exactly "yes"/"no" and each Planner generation (plan, reflection,
    replan if any) has balanced think tags; else 0 (reference: ``gt_reward_core``). The texts are the
    raw generations, thinking included (``records.PlannerTexts``): stripped ones are always balanced."""
    planner_texts = [plan, reflection] + ([replan] if replan else [])
    if not is_exact_yes_no(reflection):
        return 0.0
    return 1.0 if all(is_think_balanced(text) for text in planner_texts) else 0.0


def decision_reward(is_first_correct: bool, did_replan: bool) -> float:
    """r2: 1 when the Planner replanned exactly when the first answer was wrong."""
    return 1.0 if did_replan != is_first_correct else 0.0


def supervised_reward(
    is_final_correct: bool, is_first_correct: bool, format_score: float, decision_score: float,
    weights: RewardWeights,
) -> float:
    """Eq. 4: R = w_final·acc(final) + w_first·acc(first) + w_format·format + w_decision·decision."""
    return (weights.final * float(is_final_correct) + weights.first * float(is_first_correct)
            + weights.format * format_score + weights.decision * decision_score)


def unsupervised_reward(is_correct: bool, format_score: float, weights: RewardWeights) -> float:
    """Without ground truth: R = w_verdict·[Area Chair says correct] + w_format·format."""
    return weights.unsupervised_verdict * float(is_correct) + weights.unsupervised_format * format_score


def rollout_reward(rollout: Rollout, weights: RewardWeights) -> float:
    """The reward of a judged rollout; the verdict's source picks the supervised or unsupervised form.

    Without a replan the first answer is the final one, so ``first_verdict`` may be left None."""
    trajectory = rollout.trajectory
    fmt = format_reward(*_planner_generations(rollout))
    final = rollout.verdict
    if final is None:
        return 0.0
    if final.source == "unsupervised":
        return unsupervised_reward(final.is_correct, fmt, weights)
    first = rollout.first_verdict if rollout.first_verdict is not None else final
    decision = decision_reward(first.is_correct, trajectory.did_replan)
    return supervised_reward(final.is_correct, first.is_correct, fmt, decision, weights)


def _planner_generations(rollout: Rollout) -> tuple[str, str, str]:
    """(plan, reflection, replan or "") as the Planner generated them: the raw texts the rollout recorded,
    else (a rollout built without them) the ones it keeps."""
    trajectory, raw = rollout.trajectory, rollout.trajectory.planner_texts
    if raw is not None:
        return raw.plan, raw.reflection, raw.replan if trajectory.did_replan else ""
    return rollout.plan, trajectory.reflection, trajectory.replan if trajectory.did_replan else ""


def group_advantages(rewards: Sequence[float], eps: float) -> list[float]:
    """A_i = (R_i − mean R)/(std R + ε) over one group, population std (MIA algorithm 3, step 5).

    The one implementation: the loop reports it per rollout and the learner trains on it. A group whose
    rewards are all equal carries no signal: its advantages are exactly zero (the formula alone would leave
    the float noise of the mean, divided by ε: 1.1e-10 for three rollouts rewarded 0.95)."""
    if not rewards or max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def select_memories(rollouts: Sequence[Rollout], rng: random.Random) -> tuple[Rollout | None, Rollout | None]:
    """(shortest successful rollout, one random failed rollout) by ``memory.consolidation.choose_rollouts``;
    either may be None. The one pick: the memory service stores these two as they are.

    Shortest = fewest Executor turns, then fewest characters (``Rollout.length``); the first among equals.
    Rollouts without a usable verdict (none, or the judge's output was garbage) have no label to learn from."""
    return choose_rollouts([r for r in rollouts if r.verdict is not None and r.verdict.is_parsed], rng)

