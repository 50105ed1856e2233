"""Judging answers: request builders, output-to-Verdict rules, and a cheap string matcher.

The loop (or ``judge_supervised`` with an ``LLMGrader``, and ``judge_unsupervised``, below) does::

    messages, options = build_grader(question, gold, prediction, config)
    text, = await complete(client.role(config.roles.judge), messages, options, keep_thinking=False)
    verdict = parse_grader(text)

Supervised: the paper's SimpleQA grader with the gold target (A correct / B incorrect / C not
attempted). Unsupervised: three reviewers (run concurrently; the reference ran them one by one)
and an Area Chair who decides A/B, prioritising fatal flaws over minor ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from ..engines.client import EngineClient, SamplingOptions
from . import prompts
from .answer_match import is_match
from ..config.agent import AgentConfig
from .evidence_support import grounding, passages_of
from .executor_run import evidence_texts
from .llm import complete, sampling_options
from .records import Trajectory
from .verdicts import (
    GRADER_REGEX,
    Review,
    ReviewerKind,
    Verdict,
    area_chair_schema,
    parse_area_chair,
    parse_grade,
    parse_review,
    review_schema,
)

Messages = list[dict[str, str]]
REVIEWERS: tuple[ReviewerKind, ...] = ("logic", "sourcing", "validity")
_REVIEW_TEMPLATES = {"logic": prompts.REVIEW_LOGIC, "sourcing": prompts.REVIEW_SOURCING,
                     "validity": prompts.REVIEW_VALIDITY}


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


# ---- supervised --------------------------------------------------------------------------------


def render_gold(answers: Sequence[str]) -> str:
    """One gold answer as itself; several as the Python list the reference shows its judge (a row's
    ``answer`` list formatted into the prompt)."""
    return answers[0] if len(answers) == 1 else str(list(answers))


def build_grader(question: str, gold_answers: Sequence[str], prediction: str,
                 config: AgentConfig) -> tuple[Messages, SamplingOptions]:
    """The paper's grading request (``prompts.GRADER`` after its system message); structured mode forces
    a single letter, what the prompt asks for anyway."""
    text = prompts.GRADER.render(question=question, gold=render_gold(gold_answers), prediction=prediction)
    regex = GRADER_REGEX if config.structured_judges else None
    messages = [{"role": "system", "content": prompts.GRADER_SYSTEM}, *_user(text)]
    return messages, sampling_options(config.sampling.grader, regex=regex)


def parse_grader(text: str) -> Verdict:
    """A → correct; B or C → incorrect; garbage → the default incorrect verdict (``is_parsed`` False)."""
    label = parse_grade(text)
    if label is None:
        return Verdict(False, "B", "supervised", reason="unparseable grader output", is_parsed=False)
    return Verdict(label == "A", label, "supervised")


def not_attempted(source: str = "supervised") -> Verdict:
    """An empty answer is not sent to the judge (reference): it is not attempted, hence incorrect."""
    if source == "unsupervised":
        return Verdict(False, "B", "unsupervised", reason="empty answer")
    return Verdict(False, "C", "supervised", reason="empty answer")


class SupervisedJudge(Protocol):
    """How an answer is graded against the gold answers (``agent.supervised_judge``)."""

    async def grade(self, client: EngineClient, question: str, gold_answers: Sequence[str], prediction: str) -> Verdict:
        ...


class LLMGrader:
    """The SimpleQA-style grader (``supervised_judge = "llm"``; paper, reference)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    async def grade(self, client: EngineClient, question: str, gold_answers: Sequence[str], prediction: str) -> Verdict:
        messages, options = build_grader(question, gold_answers, prediction, self.config)
        (text,) = await complete(client.role(self.config.roles.judge), messages, options, keep_thinking=False)
        return parse_grader(text)


class StringMatch:
    """Normalised exact-or-contains match, no model call (``supervised_judge = "match"``): for judge
    models too small to grade."""

    async def grade(self, client: EngineClient, question: str, gold_answers: Sequence[str], prediction: str) -> Verdict:
        is_correct = is_match(prediction, gold_answers)
        return Verdict(is_correct, "A" if is_correct else "B", "supervised", reason="normalised string match")


async def judge_supervised(client: EngineClient, judge: SupervisedJudge, question: str,
                           gold_answers: Sequence[str], prediction: str | None) -> Verdict:
    """An empty answer is not attempted (no call); any other is graded by ``judge``."""
    if not prediction or not prediction.strip():
        return not_attempted("supervised")
    return await judge.grade(client, question, gold_answers, prediction)


# ---- unsupervised ------------------------------------------------------------------------------


def build_review(kind: ReviewerKind, question: str, trajectory: str, prediction: str,
                 config: AgentConfig) -> tuple[Messages, SamplingOptions]:
    """One reviewer's request; the validity reviewer sees only the question and the answer."""
    fields: dict[str, object] = {"question": question, "prediction": prediction,
                                 "max_words": config.review_reason_max_words}
    if kind != "validity":
        fields["trajectory"] = trajectory
    schema = review_schema() if config.structured_judges else None
    options = sampling_options(config.sampling.reviewer, json_schema=schema)
    return _user(_REVIEW_TEMPLATES[kind].render(**fields)), options


def build_area_chair(question: str, trajectory: str, prediction: str, reviews: Sequence[Review],
                     config: AgentConfig) -> tuple[Messages, SamplingOptions]:
    """The Area Chair reads the trajectory itself, not only the reviews (as in the reference)."""
    weights = config.review_weights
    text = prompts.AREA_CHAIR.render(
        question=question, trajectory=trajectory, prediction=prediction, reviews=prompts.render_reviews(reviews),
        w_logic=weights.logic, w_sourcing=weights.sourcing, w_validity=weights.validity)
    schema = area_chair_schema() if config.structured_judges else None
    return _user(text), sampling_options(config.sampling.area_chair, json_schema=schema)


def unsupervised_verdict(reviews: Sequence[Review], area_chair_text: str) -> Verdict:
    """The Area Chair's A/B decides; garbage → the default incorrect verdict (``is_parsed`` False)."""
    decision, reason = parse_area_chair(area_chair_text)
    if decision is None:
        return Verdict(False, "B", "unsupervised", list(reviews), "unparseable Area Chair output", False)
    return Verdict(decision == "A", decision, "unsupervised", list(reviews), reason)


async def judge_unsupervised(client: EngineClient, config: AgentConfig, question: str, trajectory: str,
                             prediction: str | None) -> Verdict:
    """Three reviews concurrently, then the Area Chair."""
    if not prediction or not prediction.strip():
        return not_attempted("unsupervised")
    requests = [build_review(kind, question, trajectory, prediction, config) for kind in REVIEWERS]
    judge = client.role(config.roles.judge)
    texts = await asyncio.gather(*(complete(judge, m, o, keep_thinking=False) for m, o in requests))
    reviews = [parse_review(kind, text[0]) for kind, text in zip(REVIEWERS, texts)]
    messages, options = build_area_chair(question, trajectory, prediction, reviews, config)
    (text,) = await complete(judge, messages, options, keep_thinking=False)
    return unsupervised_verdict(reviews, text)


class UnsupervisedJudge(Protocol):
    async def judge(self, client: EngineClient, question: str, trajectory: Trajectory,
                    prediction: str | None) -> Verdict:
        """The verdict on ``prediction``, the answer returned for ``trajectory``, without ground truth."""
        ...


class ReviewersJudge:
    """Three LLM reviewers and the Area Chair (``unsupervised_judge = "reviewers"``; paper, reference)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    async def judge(self, client: EngineClient, question: str, trajectory: Trajectory,
                    prediction: str | None) -> Verdict:
        trace = prompts.render_trace(question, trajectory.turns, trajectory.observations, self.config.trace_max_words)
        return await judge_unsupervised(client, self.config, question, trace, prediction)


class GroundedJudge:
    """Correct iff a retrieved passage about the question's subject states the answer
    (``unsupervised_judge = "grounded"``): ``evidence_support.grounding`` (relevance × coverage, an
    IDF-weighted lexical entailment test in character n-grams, any script) >= ``min_grounding``, no model
    call: for judge models whose reviews are near random. It rewards a plan whose searches found the
    passage that answers, which is what the Planner controls. Independent of the answer choice, which
    reads the model's confidence (``answer_choice.py``): the judge checks the chosen answer, not the
    chooser's own score. An answer the passages cannot write out (yes/no) is not grounded."""

    def __init__(self, min_grounding: float) -> None:
        self.min_grounding = min_grounding

    async def judge(self, client: EngineClient, question: str, trajectory: Trajectory,
                    prediction: str | None) -> Verdict:
        return self.verdict(question, prediction, evidence_texts(trajectory.observations))

    def verdict(self, question: str, prediction: str | None, evidence: Sequence[str]) -> Verdict:
        """The verdict on ``prediction`` given the texts of the rollout's successful searches."""
        found = grounding(question, prediction, passages_of(evidence))
        is_correct = found.score > 0 and found.score >= self.min_grounding
        return Verdict(is_correct, "A" if is_correct else "B", "unsupervised",
                       reason=f"grounded: {found.score:.2f} (relevance {found.relevance:.2f} x coverage "
                              f"{found.coverage:.2f}) in {found.title!r}")
