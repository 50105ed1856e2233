"""What the Planner writes (``agent.plan_form``), one strategy each, and the replay of verified plans
(``agent.replay_min_similarity``).

``ProsePlan`` is the paper's: a step-by-step plan the Executor reads as its guide, a prose replan.
``SearchesPlan`` is the departure for Planners too small to write prose a small Executor can follow:
the plan is the searches to make, written under a regex, which the Executor runs in order. Either way
the plan is the policy's sample (under a regex, from the policy restricted to what the grammar allows),
which the learner scores under the same restriction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from . import prompts
from .model_text import strip_think
from .plan_searches import parse_plan_searches, plan_searches_chars, plan_searches_regex, render_plan_searches
from ..memory.entries import MemoryHit


class PlannerRequest(msgspec.Struct, frozen=True):
    """What one Planner turn is asked, under which regex (None = free), and the token budget that never
    cuts what the regex allows (a token is at least one character; 0 without a regex)."""

    text: str
    regex: str | None = None
    min_tokens: int = 0


class PlanForm(Protocol):
    regex: str | None
    """The regex every sampled plan and replan is written under (None = free)."""
    pins_searches: bool
    """The plan lists searches the Executor must run (its turns are fixed by them)."""

    def request(self, question: str, memories: str, caption: str | None, *, has_image: bool) -> PlannerRequest: ...

    def replan_request(self) -> PlannerRequest: ...

    def searches(self, plan: str) -> list[str]:
        """The queries a plan pins, in order ([] when the form pins none)."""
        ...

    def replay_text(self, plan: str) -> str:
        """A stored plan as this form writes it (what a replay writes as the Planner's plan)."""
        ...


class ProsePlan:
    """A step-by-step plan in prose, shown to the Executor as its guide (``plan_form = "text"``)."""

    regex = None
    pins_searches = False

    def __init__(self, max_words: int, max_words_image: int, replan_max_words: int) -> None:
        self.max_words, self.max_words_image, self.replan_max_words = max_words, max_words_image, replan_max_words

    def request(self, question: str, memories: str, caption: str | None, *, has_image: bool) -> PlannerRequest:
        max_words = self.max_words_image if has_image else self.max_words
        return PlannerRequest(prompts.render_plan_prompt(question, memories, max_words, caption))

    def replan_request(self) -> PlannerRequest:
        return PlannerRequest(prompts.REPLAN.render(max_words=self.replan_max_words))

    def searches(self, plan: str) -> list[str]:
        return []

    def replay_text(self, plan: str) -> str:
        return strip_think(plan)


class SearchesPlan:
    """One to ``max_searches`` lines ``Search: <query>``, always under their regex (a small Planner
    samples the form from its own policy almost never); a replan in the same form (``plan_form =
    "searches"``)."""

    pins_searches = True

    def __init__(self, max_searches: int, max_query_chars: int, *, is_question_searched: bool) -> None:
        self.max_searches = max_searches
        self.is_question_searched = is_question_searched
        """The Executor's first search is the question (``first_query``): the prompt says so."""
        self.regex: str | None = plan_searches_regex(max_searches, max_query_chars)
        self._chars = plan_searches_chars(max_searches, max_query_chars)

    def request(self, question: str, memories: str, caption: str | None, *, has_image: bool) -> PlannerRequest:
        text = prompts.render_plan_searches_prompt(question, memories, self.max_searches, caption,
                                                   is_question_searched=self.is_question_searched)
        return PlannerRequest(text, self.regex, self._chars)

    def replan_request(self) -> PlannerRequest:
        return PlannerRequest(prompts.REPLAN_SEARCHES.render(max_searches=self.max_searches), self.regex, self._chars)

    def searches(self, plan: str) -> list[str]:
        return parse_plan_searches(plan, self.max_searches)

    def replay_text(self, plan: str) -> str:
        plan = strip_think(plan)
        return render_plan_searches(parse_plan_searches(plan, self.max_searches)) or plan


class PlanReplay:
    """Verified-plan replay (``replay_min_similarity``): the plan of the best positive memory whose
    question has a raw cosine at least ``min_similarity`` to the question; None = never (paper)."""

    def __init__(self, min_similarity: float | None) -> None:
        self.min_similarity = min_similarity

    def pick(self, positives: Sequence[MemoryHit]) -> str | None:
        """The stored plan to write again at inference, or None (then the Planner writes its own)."""
        floor = self.min_similarity
        if floor is None:
            return None
        return next((hit.entry.plan for hit in positives if hit.sim >= floor and strip_think(hit.entry.plan)), None)
