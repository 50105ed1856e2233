"""The records of one research rollout, as the loop builds them and the rewards and the learner read
them: the Executor's trajectory under a plan (with the Planner's reflection, replan and tokens), the
time spent per stage, and the judged ``Rollout`` (the memory takes its own summary of one:
``memory/entries.py: SummarisedRollout``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..tools.calls import Observation
from .turns import ExecutorTurn
from .verdicts import Verdict


AnswerSource = Literal["own", "closed_book"]
"""Where a returned answer came from: the rollout (its Executor or its evidence answer) or the closed-book
candidate (``agent.answer_choice``)."""


class PlannerSegment(msgspec.Struct, frozen=True):
    """One Planner generation within ``PlannerTokens.completion_ids``: tokens ``[start, end)``, sampled
    under ``regex`` (structured outputs) or freely (None)."""

    start: int
    end: int
    regex: str | None = None


class PlannerTokens(msgspec.Struct, frozen=True):
    """The Planner's share of one rollout in token space, as the learner trains on it (MIA Eq. 3: the
    Planner's own tokens only). ``completion_ids`` is everything after the prompt, in order: the plan,
    the template's turn between it and the reflection question, the yes/no, then the replan request and
    the replan; ``completion_mask`` is 1 where the Planner sampled the token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    segments: list[PlannerSegment] = []
    """The Planner's generations (plan, reflection, replan), where each lies and under which regex."""
    logprobs: list[float] | None = None
    """Per completion token, the sampler's log-prob of it (NaN where it gave none: template tokens, a
    generation that did not ask); None when no generation asked (``Completion.logprobs``)."""
    policy_version: int | None = None
    """The Planner adapter version serving just before the rollout's plan was sampled (None: unknown, no
    adapter): the learner's staleness bound reads it."""


class PlannerTexts(msgspec.Struct, frozen=True):
    """The Planner's generations of one rollout as it sampled them, thinking included (the format reward
    reads these: a think block stripped before it looks could never be unbalanced)."""

    plan: str = ""
    reflection: str = ""
    """"" when the reflection step did not run."""
    replan: str = ""
    """"" without a replan."""


class Trajectory(msgspec.Struct, frozen=True):
    """One Executor run under one plan, with the Planner's reflection and replan."""

    turns: list[ExecutorTurn]
    observations: list[Observation | None]
    """Aligned with ``turns``: the tool result that followed each turn (None when none)."""
    first_answer: str | None
    """Answer before any replan (the reward's acc(first)): the Executor's own, or with
    ``agent.answer_from = "evidence"`` the one read off its passages."""
    final_answer: str | None
    """Answer returned to the user (equal to ``first_answer`` without a replan)."""
    reflection: str = ""
    """The Planner's yes/no generation after its thinking where the engine splits it off ("" when the
    reflection step did not run; the raw text is in ``planner_texts``)."""
    replan: str = ""
    """The Planner's replan as the Executor read it, its thinking stripped ("" without a replan)."""
    did_replan: bool = False
    replan_turn: int = -1
    """Index of the first turn run under the replan; -1 without one."""
    num_tool_calls: int = 0
    num_successful_tool_calls: int = 0
    planner: PlannerTokens | None = None
    """The Planner's tokens for the learner (None when the engine gave no token ids)."""
    planner_texts: PlannerTexts | None = None
    """The Planner's raw generations (None: not recorded, e.g. plain ReAct)."""
    answer_source: AnswerSource = "own"
    """Where ``final_answer`` came from (``agent.answer_choice`` may return the closed-book candidate)."""
    own_answer: str | None = None
    """The rollout's own final answer when the closed-book candidate replaced it (None otherwise)."""

    @property
    def length(self) -> tuple[int, int]:
        """(turns, characters): the shortest successful trajectory becomes the positive memory."""
        return len(self.turns), sum(len(turn.text) for turn in self.turns)


class Timings(msgspec.Struct, frozen=True):
    """Seconds spent per stage of one rollout."""

    plan_s: float = 0.0
    execute_s: float = 0.0
    reflect_s: float = 0.0
    judge_s: float = 0.0


class Rollout(msgspec.Struct, frozen=True):
    """One of a question's G rollouts: plan → trajectory → verdict → reward."""

    plan: str
    """The Planner's raw plan generation (think block included: the format reward checks it)."""
    trajectory: Trajectory
    verdict: Verdict | None = None
    first_verdict: Verdict | None = None
    """Verdict on the first answer when it differs from the final one (None = same as ``verdict``)."""
    reward: float = 0.0
    advantage: float = 0.0
    timings: Timings = Timings()

    @property
    def is_correct(self) -> bool:
        return self.verdict is not None and self.verdict.is_correct

    @property
    def length(self) -> tuple[int, int]:
        """The trajectory's (turns, characters): the shortest success becomes the positive memory."""
        return self.trajectory.length
