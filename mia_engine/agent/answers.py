"""Where a trajectory's answer comes from (``agent.answer_from``), one strategy each: the Executor's
own ``<answer>`` (paper, reference), or one short call that reads the passages its searches returned.
"""

from __future__ import annotations

import unicodedata
from typing import Protocol

from . import prompts
from ..config.agent import AgentConfig
from .executor_run import ExecutorRun, Messages
from .llm import sampling_options
from ..engines.client import SamplingOptions
from ..tools.calls import truncate_words


class AnswerStrategy(Protocol):
    is_executor_answer: bool
    """The Executor's last turn answers; else the loop reads the answer off the evidence after the
    searches, so a rollout whose searches are all fixed generates no Executor turn at all."""

    def trace_note(self, answer: str | None) -> str:
        """What the Planner's reflection reads after the trace about the answer ("" = nothing)."""
        ...

    def request(self, run: ExecutorRun, latest_from: int) -> tuple[Messages, SamplingOptions] | None:
        """The Executor call that writes the answer; None = the trajectory's own answer stands."""
        ...


class TrajectoryAnswer:
    """The Executor's own ``<answer>`` (``answer_from = "trajectory"``; paper, reference)."""

    is_executor_answer = True

    def trace_note(self, answer: str | None) -> str:
        return ""

    def request(self, run: ExecutorRun, latest_from: int) -> tuple[Messages, SamplingOptions] | None:
        return None


class EvidenceAnswer:
    """One short Executor call that sees only the question and the passages the searches returned, no
    plan and no thinking (``answer_from = "evidence"``); the trajectory's answer when none succeeded."""

    is_executor_answer = False

    def __init__(self, config: AgentConfig) -> None:
        self.max_words = config.evidence_max_words
        self.sampling = config.sampling.answer

    def trace_note(self, answer: str | None) -> str:
        """The answer, which is not one of the Executor's turns, shown after the trace."""
        return prompts.TRACE_ANSWER.render(answer=answer) if answer else ""

    def request(self, run: ExecutorRun, latest_from: int) -> tuple[Messages, SamplingOptions] | None:
        """``latest_from``: the turn where the latest round of searches (a replan's) begins, whose passages
        are read first (the evidence is cut to a word budget, and a replan searches for what the first
        round lacked)."""
        evidence = run.evidence(latest_from)
        if not evidence:
            return None
        passages = truncate_words("\n".join(dict.fromkeys(evidence)), self.max_words)
        text = prompts.EVIDENCE_ANSWER.render(passages=passages, question=run.question)
        content: str | list[dict[str, str]] = [{"type": "image"}, {"type": "text", "text": text}] if run.images else text
        # no constraint (a bounded free-text regex costs xgrammar seconds to compile under load); the text
        # ends at a blank line or the token budget, and ``answer_lines`` reads the answer off it
        return [{"role": "user", "content": content}], sampling_options(self.sampling, stop=["\n\n"])


def answer_lines(text: str) -> str:
    """The answer in a reply asked for the answer alone: its first non-empty line, with the next one when
    the first ends in a colon (of any script: ":", "：", ...), which introduces what follows rather than
    stating it; "" when nothing follows such a line (the reply states nothing); the lines after the answer
    are dropped (a small reader goes on to restate or ramble)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if unicodedata.name(lines[0][-1], "").endswith("COLON"):
        return f"{lines[0]} {lines[1]}" if len(lines) > 1 else ""
    return lines[0]
