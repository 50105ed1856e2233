"""The Executor's side of one rollout while it is built: its conversation, its parsed turns and what
followed each, what it carries to every tool call and progress event (the tool context, the rollout's
index, the emitter), and the small edits the loop makes to it (a turn recorded, a tool call counted,
the answer-only notice, the final-answer request of a full context, the hand-over to a replan).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import prompts
from .turns import ANSWER_CLOSE, ANSWER_OPEN, CALL_CLOSE, CALL_OPEN, ExecutorTurn
from ..tools.calls import Observation, ToolCall
from ..tools.registry import IMAGE_SEARCH, SEARCH, ToolContext

Messages = list[dict[str, Any]]
Emit = Callable[[str, dict], None]
"""Progress callback: (stage, details), e.g. ("tool_call", {"rollout": 0, "name": "search", ...})."""

EVIDENCE_TOOLS = (SEARCH, IMAGE_SEARCH)
"""Tools whose successful results the evidence answer reads (passages; titles of similar images)."""
ANSWER_BLOCK = re.compile(r"<answer>.*?(</answer>|$)", re.DOTALL)
"""An ``<answer>`` and its body (to the end when unclosed): stripped from the turn a replan continues."""


def ignore_progress(stage: str, details: dict) -> None:
    """An ``Emit`` that reports nothing."""
    return None


@dataclass
class ExecutorRun:
    """A trajectory being built: the Executor's conversation and its parsed turns, and what the rollout
    carries to every tool call (``context``) and progress event (``index``, ``emitter``)."""

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
    context: ToolContext = field(default_factory=ToolContext)
    """The rollout's tool state (the question's id and image, the image searches made)."""
    index: int = 0
    """The rollout's index among the question's G, in every event it emits."""
    emitter: Emit = ignore_progress
    is_context_full: bool = False
    """The conversation filled the Executor's context (free-form path): its last turn answered the
    final-answer request, and nothing follows it (no reflection, no replan)."""

    @classmethod
    def start(cls, question: str, executor_prompt: str, context: ToolContext, index: int, emitter: Emit, *,
              affinity: str | None) -> ExecutorRun:
        """Rollout ``index``'s Executor conversation before its first turn (the image part first when the
        question has one, ``context.image``); ``affinity``: the question's replica key, to which the
        rollout's own turns add its index."""
        image = context.image
        content: str | list[dict[str, str]] = executor_prompt
        if image is not None:
            content = [{"type": "image"}, {"type": "text", "text": executor_prompt}]
        return cls([{"role": "user", "content": content}], question,
                   affinity=f"{affinity}/{index}" if affinity else None, planner_affinity=affinity,
                   images=[image] if image is not None else [], context=context, index=index, emitter=emitter)

    def emit(self, stage: str, details: dict) -> None:
        """A progress event of this rollout (its index first, then ``details``)."""
        self.emitter(stage, {"rollout": self.index, **details})

    def last_answer(self, *, whole_turn: bool = False) -> str | None:
        """The ``<answer>`` of the last turn; None when the trajectory ended without one (malformed
        output, turn cap, full context), which the user sees as "no answer was found".

        ``whole_turn`` (the free-form path): the reference's reading of a last turn that ended the
        trajectory, nothing following it: its ``<answer>``, else the rest of it after an unclosed
        ``<answer>`` (not after the final-answer request), else the whole turn, thinking included
        (``react_agent.py``). At the turn cap, whose last turn called a tool: None, as ever (the
        reference's fixed "Sorry, the number of llm calls exceeds the limit.")."""
        if not whole_turn:
            return self.turns[-1].answer if self.turns and self.turns[-1].tool_call is None else None
        if not self.turns or self.observations[-1] is not None:
            return None
        turn = self.turns[-1]
        if turn.answer is not None:
            return turn.answer
        _, tag, rest = turn.text.partition(ANSWER_OPEN)
        unclosed = tag and not self.is_context_full
        return (rest.partition(ANSWER_CLOSE)[0] if unclosed else turn.text).strip() or None

    def evidence(self, latest_from: int = 0) -> list[str]:
        """The text of every successful search (``EVIDENCE_TOOLS``), the round from turn ``latest_from``
        (a replan's) first."""
        return evidence_texts([*self.observations[latest_from:], *self.observations[:latest_from]])

    def count_call(self, observation: Observation) -> None:
        """A tool call made, and whether it succeeded."""
        self.num_tool_calls += 1
        self.num_successful_tool_calls += int(observation.is_success)

    def record(self, turn: ExecutorTurn, observation: Observation | None) -> None:
        """A turn and what followed it, in the trajectory and in the Executor's conversation (no tool
        response when the turn ended the loop)."""
        self.turns.append(turn)
        self.observations.append(observation)
        self.messages.append({"role": "assistant", "content": turn.text})
        if observation is not None:
            self.messages.append({"role": "user", "content": prompts.TOOL_RESPONSE.render(text=observation.text)})

    def ask_for_the_answer(self) -> None:
        """Before the answer-only turn: say so (and restate the question) after the last tool response."""
        if self.turns and self.messages[-1]["role"] == "user":
            last = self.messages[-1]
            self.messages[-1] = {**last, "content": last["content"] + "\n\n"
                                 + prompts.FINAL_ANSWER.render(question=self.question)}

    def ask_for_the_answer_at_full_context(self) -> None:
        """Before the turn that ends a conversation past the context limit (free-form path): the
        final-answer request in place of the last message (a tool response or the revised plan), as the
        reference does; the trajectory ends with that turn."""
        request = {"role": "user", "content": prompts.CONTEXT_FULL_ANSWER.render()}
        if len(self.messages) > 1 and self.messages[-1]["role"] == "user":
            self.messages[-1] = request
        else:
            self.messages.append(request)
        self.is_context_full = True

    def continue_with(self, replan: str) -> None:
        """Keep the Executor's last turn minus its ``<answer>`` and hand it the revised plan (the
        reference's words)."""
        last = self.messages[-1]
        if self.turns and self.turns[-1].tool_call is None and last["role"] == "assistant":
            kept = ANSWER_BLOCK.sub("", last["content"]).strip()
            if kept:
                self.messages[-1] = {**last, "content": kept}
            else:
                self.messages.pop()
        self.messages.append({"role": "user", "content": prompts.REPLAN_CONTINUATION.render(replan=replan)})


def evidence_texts(observations: list[Observation | None]) -> list[str]:
    """The text of every successful search among ``observations`` (``EVIDENCE_TOOLS``), in order."""
    return [o.text for o in observations if o is not None and o.is_success and o.tool in EVIDENCE_TOOLS]


def search_calls(queries: list[str]) -> list[ToolCall]:
    """One search call per query, in order (the turns the loop writes for pinned searches)."""
    return [ToolCall(SEARCH, {"query_list": [query]}) for query in queries]


def call_text(call: ToolCall) -> str:
    """``call`` as a turn writes it: its JSON between the tool-call tags, a line each."""
    return f"{CALL_OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


def written_turn(call: ToolCall) -> ExecutorTurn:
    """A pinned turn the loop writes for the Executor: the call alone, no thinking, nothing generated
    (``raw`` is empty)."""
    return ExecutorTurn("", call_text(call), None, call, None, True)
