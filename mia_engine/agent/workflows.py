"""Workflow memories read off a trajectory (``agent.workflow_summary = "extractive"``).

The paper's Manager compresses a judged trajectory into numbered "**action purpose** (input →
output)" steps. A Manager too small for that invents names the trajectory never saw, and the Planner
copies them into every later plan for the question. This writes the same steps from what the
trajectory actually did: each tool call's queries and the titles its results carried, then the
answer and, for a failure, that it was judged wrong. A rollout of a ``searches`` plan is written as the
searches it ran, in the plan's form.
"""

from __future__ import annotations

import json
import re
import sys

from ..tools.calls import Observation, truncate_words
from ..tools.registry import query_list
from .plan_searches import render_plan_searches
from .records import Trajectory
from .turns import ExecutorTurn

_TITLE = re.compile(r"(?:Doc|Image) \d+\(Title: ([^)\n]*)\)")
_MAX_TITLES = 3


def searches_workflow(searches: list[str], is_correct: bool) -> str:
    """The workflow of a ``searches`` plan's rollout: its searches in the plan's own lines (what the
    Executor ran after its first search), so a later Planner reuses them by copying; a failure says so."""
    outcome = "" if is_correct else "(judged incorrect: avoid these searches)\n"
    return (render_plan_searches(searches) or "(no searches beyond the question)\n") + outcome


def extractive_workflow(trajectory: Trajectory, is_correct: bool, max_words: int) -> str:
    steps = [_step(turn, observation) for turn, observation in zip(trajectory.turns, trajectory.observations)]
    steps = [step for step in steps if step]
    answer = " ".join((trajectory.final_answer or "").split())
    outcome = "" if is_correct else " — judged incorrect: avoid this answer"
    steps.append(f"**answer** (the passages above → {answer or 'none'}){outcome}")
    text = "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))
    return truncate_words(text, max_words)


def _step(turn: ExecutorTurn, observation: Observation | None) -> str:
    call = turn.tool_call
    if call is None:
        return ""
    queries, error = query_list(call.arguments, max_queries=sys.maxsize)  # the search tool's own parsing, uncapped
    if error:  # not a search (or a malformed one): its arguments as given
        inputs = json.dumps(call.arguments, ensure_ascii=False)
    else:
        inputs = "; ".join(" ".join(query.split()) for query in queries)
    if observation is None or not observation.is_success:
        output = "no result"
    else:
        titles = list(dict.fromkeys(_TITLE.findall(observation.text)))[:_MAX_TITLES]
        output = ", ".join(titles) or truncate_words(" ".join(observation.text.split()), 12, " …")
    return f"**{call.name}** ({inputs} → {output})"
