"""Judging answers: request builders, output-to-Verdict rules, and a cheap string matcher.

The loop (or ``judge_supervised`` with an ``LLMGrader``, and ``judge_unsupervised``, below) does::

    messages, options = build_grader(question, gold, prediction, config)
    text, = await complete(client, config.roles.judge, messages, options)
    verdict = parse_grader(text)

Supervised: a SimpleQA-style grader with the gold target (A correct / B incorrect / C not
attempted). Unsupervised: three reviewers (run concurrently; the reference ran them one by one)
and an Area Chair who decides A/B, prioritising fatal flaws over minor ones.
"""

from __future__ import annotations

import asyncio
import re
import string
import unicodedata
from collections.abc import Sequence
from typing import Protocol

from ..engines.client import SamplingOptions
from . import prompts
from .config import AgentConfig
from .llm import ChatClient, complete, sampling_options
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


def build_grader(question: str, gold_answers: Sequence[str], prediction: str,
                 config: AgentConfig) -> tuple[Messages, SamplingOptions]:
    """The SimpleQA-style grading request; structured mode forces a single letter."""
    text = prompts.GRADER.render(question=question, gold=" | ".join(gold_answers), prediction=prediction)
    regex = GRADER_REGEX if config.structured_judges else None
    return _user(text), sampling_options(config.sampling.grader, regex=regex)


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

    async def grade(self, client: ChatClient, question: str, gold_answers: Sequence[str], prediction: str) -> Verdict:
        ...


class LLMGrader:
    """The SimpleQA-style grader (``supervised_judge = "llm"``; paper, reference)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    async def grade(self, client: ChatClient, question: str, gold_answers: Sequence[str], prediction: str) -> Verdict:
        messages, options = build_grader(question, gold_answers, prediction, self.config)
        (text,) = await complete(client, self.config.roles.judge, messages, options)
        return parse_grader(text)


class StringMatch:
    """Normalised exact-or-contains match, no model call (``supervised_judge = "match"``): for judge
    models too small to grade."""

    async def grade(self, client: ChatClient, question: str, gold_answers: Sequence[str], prediction: str) -> Verdict:
        is_correct = is_match(prediction, gold_answers)
        return Verdict(is_correct, "A" if is_correct else "B", "supervised", reason="normalised string match")


async def judge_supervised(client: ChatClient, judge: SupervisedJudge, question: str,
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


async def judge_unsupervised(client: ChatClient, config: AgentConfig, question: str, trajectory: str,
                             prediction: str | None) -> Verdict:
    """Three reviews concurrently, then the Area Chair."""
    if not prediction or not prediction.strip():
        return not_attempted("unsupervised")
    requests = [build_review(kind, question, trajectory, prediction, config) for kind in REVIEWERS]
    texts = await asyncio.gather(*(complete(client, config.roles.judge, m, o) for m, o in requests))
    reviews = [parse_review(kind, text[0]) for kind, text in zip(REVIEWERS, texts)]
    messages, options = build_area_chair(question, trajectory, prediction, reviews, config)
    (text,) = await complete(client, config.roles.judge, messages, options)
    return unsupervised_verdict(reviews, text)


# ---- string matching (reporting accuracy without an LLM) -----------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans({char: " " for char in string.punctuation + "‘’“”–—"})


def normalize_answer(text: str) -> str:
    """SQuAD-style: lower case, accents and punctuation removed, articles dropped, spaces collapsed."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """The normalised prediction equals one normalised gold answer."""
    if not prediction:
        return False
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(gold) for gold in gold_answers if normalize_answer(gold))


def contains_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """One normalised gold answer occurs in the normalised prediction as whole words."""
    if not prediction:
        return False
    predicted = f" {normalize_answer(prediction)} "
    return any(f" {gold} " in predicted for gold in map(normalize_answer, gold_answers) if gold)


def is_match(prediction: str | None, gold_answers: Sequence[str]) -> bool:
    """Exact or contains match: a cheap accuracy proxy; the LLM grader is the paper's metric."""
    return exact_match(prediction, gold_answers) or contains_match(prediction, gold_answers)
