"""How a judged rollout becomes a workflow memory (``agent.workflow_summary``), one writer each.

The paper's Manager compresses a judged trajectory into numbered "**action purpose** (input →
output)" steps (``ManagerSummary``). A Manager too small for that invents names the trajectory never
saw, and the Planner copies them into every later plan for the question. ``ExtractiveWorkflow``
writes the same steps from what the trajectory actually did: each tool call's queries and the titles
its results carried, then the answer and, for a failure, that it was judged wrong.
``SearchesWorkflow`` writes a rollout of a ``searches`` plan as the searches it ran, in the plan's form.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Protocol

from . import prompts
from ..engines.client import EngineClient
from ..config.agent import AgentConfig
from .llm import complete, sampling_options
from .model_text import strip_think
from .plan_searches import parse_plan_searches, render_plan_searches
from .records import Rollout, Trajectory
from .turns import ExecutorTurn
from ..tools.calls import Observation, truncate_words
from ..tools.registry import query_list

_TITLE = re.compile(r"(?:Doc|Image) \d+\(Title: ([^)\n]*)\)")
_MAX_TITLES = 3


class WorkflowWriter(Protocol):
    async def write(self, client: EngineClient, question: str, rollout: Rollout) -> str:
        """The workflow memory of a judged rollout (``client``: the engines, for a writer that asks a model)."""
        ...


class ManagerSummary:
    """The Manager summarises the trajectory (``workflow_summary = "manager"``; paper, reference)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    async def write(self, client: EngineClient, question: str, rollout: Rollout) -> str:
        """The summary, its thinking stripped; the plan's start when the Manager gives nothing."""
        config, trajectory = self.config, rollout.trajectory
        trace = prompts.render_trace(question, trajectory.turns, trajectory.observations, config.trace_max_words)
        text = prompts.WORKFLOW_SUMMARY.render(max_words=config.summary_max_words, question=question,
                                               outcome="correct" if rollout.is_correct else "incorrect",
                                               trajectory=trace)
        try:
            (summary,) = await complete(client.role(config.roles.manager), [{"role": "user", "content": text}],
                                        sampling_options(config.sampling.manager), keep_thinking=False)
        except ValueError:
            summary = ""
        return truncate_words(strip_think(summary), config.summary_max_words) or rollout.plan[:500] or "-"


class ExtractiveWorkflow:
    """The steps read off the trajectory, no model call (``workflow_summary = "extractive"``)."""

    def __init__(self, max_words: int) -> None:
        self.max_words = max_words

    async def write(self, client: EngineClient, question: str, rollout: Rollout) -> str:
        return extractive_workflow(rollout.trajectory, rollout.is_correct, self.max_words)


class SearchesWorkflow:
    """A ``searches`` plan's rollout as its searches (``workflow_summary = "extractive"`` with
    ``plan_form = "searches"``), so a later Planner reuses a success by copying it."""

    def __init__(self, max_searches: int) -> None:
        self.max_searches = max_searches

    async def write(self, client: EngineClient, question: str, rollout: Rollout) -> str:
        return searches_workflow(parse_plan_searches(rollout.plan, self.max_searches), rollout.is_correct)


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
