"""The Executor's side of one rollout while it is built: its conversation, its parsed turns and what
followed each, and the small edits the loop makes to it (a turn recorded, a turn the loop writes
itself, the answer-only notice, the hand-over to a replan).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from . import prompts
from .turns import CALL_CLOSE, CALL_OPEN, ExecutorTurn
from ..tools.calls import Observation, ToolCall
from ..tools.registry import IMAGE_SEARCH, SEARCH

Messages = list[dict[str, Any]]

EVIDENCE_TOOLS = (SEARCH, IMAGE_SEARCH)
"""Tools whose successful results the evidence answer reads (passages; titles of similar images)."""
ANSWER_BLOCK = re.compile(r"<answer>.*?(</answer>|$)", re.DOTALL)
"""An ``<answer>`` and its body (to the end when unclosed): stripped from the turn a replan continues."""


@dataclass
class ExecutorRun:
    """A trajectory being built: the Executor's conversation and its parsed turns."""

    messages: Messages
    question: str = ""
    turns: list[ExecutorTurn] = field(default_factory=list)
    observations: list[Observation | None] = field(default_factory=list)
    num_tool_calls: int = 0
    num_successful_tool_calls: int = 0
    affinity: str | None = None
    """Replica key of this rollout's Executor turns (its growing prefix stays on one replica)."""
    planner_affinity: str | None = None
    """Replica key of the Planner's reflection and replan (the replica that sampled the plan)."""
    images: list[Any] = field(default_factory=list)
    """The question's image, sent with every Executor turn (its first message holds the image part)."""
    fixed_queries: list[str] = field(default_factory=list)
    """The queries of the first text searches, in order, each pinned by its turn's regex."""

    def last_answer(self) -> str | None:
        """The ``<answer>`` of the last turn; None when the trajectory ended without one (malformed
        output, turn cap, full context), which the user sees as "no answer was found"."""
        return self.turns[-1].answer if self.turns and self.turns[-1].tool_call is None else None

    def evidence(self, latest_from: int = 0) -> list[str]:
        """The text of every successful search (``EVIDENCE_TOOLS``), the round from turn ``latest_from``
        (a replan's) first."""
        return evidence_texts([*self.observations[latest_from:], *self.observations[:latest_from]])


def evidence_texts(observations: list[Observation | None]) -> list[str]:
    """The text of every successful search among ``observations`` (``EVIDENCE_TOOLS``), in order."""
    return [o.text for o in observations if o is not None and o.is_success and o.tool in EVIDENCE_TOOLS]


def start_run(question: str, executor_prompt: str, image: Any, affinity: str | None, index: int) -> ExecutorRun:
    """Rollout ``index``'s Executor conversation before its first turn (the image part first when there
    is one); ``affinity``: the question's replica key, to which the rollout's own turns add its index."""
    content: str | list[dict[str, str]] = executor_prompt
    if image is not None:
        content = [{"type": "image"}, {"type": "text", "text": executor_prompt}]
    return ExecutorRun([{"role": "user", "content": content}], question,
                       affinity=f"{affinity}/{index}" if affinity else None, planner_affinity=affinity,
                       images=[image] if image is not None else [])


def record(run: ExecutorRun, turn: ExecutorTurn, observation: Observation | None) -> None:
    """A turn and what followed it, in the trajectory and in the Executor's conversation (no tool
    response when the turn ended the loop)."""
    run.turns.append(turn)
    run.observations.append(observation)
    run.messages.append({"role": "assistant", "content": turn.text})
    if observation is not None:
        run.messages.append({"role": "user", "content": prompts.TOOL_RESPONSE.render(text=observation.text)})


def ask_for_the_answer(run: ExecutorRun) -> None:
    """Before the answer-only turn: say so (and restate the question) after the last tool response."""
    if run.turns and run.messages[-1]["role"] == "user":
        last = run.messages[-1]
        run.messages[-1] = {**last, "content": last["content"] + "\n\n"
                            + prompts.FINAL_ANSWER.render(question=run.question)}


def continue_with(run: ExecutorRun, replan: str) -> None:
    """Keep the Executor's last turn minus its ``<answer>`` and hand it the revised plan (the
    reference's words)."""
    last = run.messages[-1]
    if run.turns and run.turns[-1].tool_call is None and last["role"] == "assistant":
        kept = ANSWER_BLOCK.sub("", last["content"]).strip()
        if kept:
            run.messages[-1] = {**last, "content": kept}
        else:
            run.messages.pop()
    run.messages.append({"role": "user", "content": prompts.REPLAN_CONTINUATION.render(replan=replan)})


def search_calls(queries: list[str]) -> list[ToolCall]:
    """One search call per query, in order (the turns the loop writes for pinned searches)."""
    return [ToolCall(SEARCH, {"query_list": [query]}) for query in queries]


def written_turn(call: ToolCall) -> ExecutorTurn:
    """A pinned turn the loop writes for the Executor: the call alone, no thinking, nothing generated
    (``raw`` is empty)."""
    text = f"{CALL_OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"
    return ExecutorTurn("", text, None, call, None, True)
