"""What the judges write and what it becomes: the supervised grader's letter and the reviewers' and
the Area Chair's JSON, each format's structured-output constraint next to its parser, and the
``Review`` and ``Verdict`` records (``judge.py`` builds the judges' requests and their verdicts).

The parsers never raise: garbage gives None (model output is untrusted text; see ``model_text``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from .model_text import as_int, first_json_object, parse_json_object, strip_think

Label = Literal["A", "B", "C"]
"""SimpleQA grades: A correct, B incorrect, C not attempted (the Area Chair uses A/B)."""
VerdictSource = Literal["supervised", "unsupervised"]
ReviewerKind = Literal["logic", "sourcing", "validity"]


class Review(msgspec.Struct, frozen=True):
    """One unsupervised reviewer's assessment."""

    kind: ReviewerKind
    score: int | None
    """1-10; None when the reviewer's output could not be parsed."""
    reason: str = ""


class Verdict(msgspec.Struct, frozen=True):
    """The judge's decision on one answer; also the memory label."""

    is_correct: bool
    label: Label
    source: VerdictSource
    reviews: list[Review] = []
    reason: str = ""
    is_parsed: bool = True
    """False when the judge's output was garbage and this is the default (incorrect) verdict."""


# ---- structured outputs ----------------------------------------------------------------------

GRADER_REGEX = "A|B|C"
"""The supervised grader's whole output: one letter."""


def review_schema() -> dict[str, Any]:
    """JSON schema of a reviewer's output (enum instead of minimum/maximum: every backend supports it)."""
    return {
        "type": "object",
        "properties": {"score": {"type": "integer", "enum": list(range(1, 11))}, "reason": {"type": "string"}},
        "required": ["score", "reason"],
        "additionalProperties": False,
    }


def area_chair_schema() -> dict[str, Any]:
    """JSON schema of the Area Chair's decision: A (correct) or B (incorrect), reason first."""
    return {
        "type": "object",
        "properties": {"reason": {"type": "string"}, "decision": {"type": "string", "enum": ["A", "B"]}},
        "required": ["reason", "decision"],
        "additionalProperties": False,
    }


# ---- parsing ---------------------------------------------------------------------------------


def parse_grade(text: str) -> Label | None:
    """The grader's letter: the whole visible output, a JSON ``grade``, or a lone A/B/C; None on garbage."""
    if not isinstance(text, str):
        return None
    visible = strip_think(text).strip().strip("\"'`*.() ").upper()
    if visible in ("A", "B", "C"):
        return visible  # type: ignore[return-value]
    value = first_json_object(strip_think(text))
    letter = str(value.get("grade", value.get("decision", ""))).strip().upper() if value else ""
    if letter in ("A", "B", "C"):
        return letter  # type: ignore[return-value]
    match = re.search(r"\b(?:grade|answer|letter)\s*(?:is)?\s*[:=]?\s*\(?([ABC])\b", strip_think(text), re.IGNORECASE)
    return match.group(1).upper() if match else None  # type: ignore[return-value]


def parse_review(kind: ReviewerKind, text: str) -> Review:
    """A reviewer's JSON ``{"score", "reason"}``; score None when it cannot be read."""
    value = parse_json_object(text) or {}
    score = as_int(value.get("score"))
    if score is None and isinstance(text, str):
        match = re.search(r"score\W{0,5}(\d{1,2})", strip_think(text), re.IGNORECASE)
        score = int(match.group(1)) if match else None
    if score is not None and not 1 <= score <= 10:
        score = None
    reason = value.get("reason")
    return Review(kind, score, reason.strip() if isinstance(reason, str) else "")


def parse_area_chair(text: str) -> tuple[Label | None, str]:
    """(A/B decision or None, reason) from the Area Chair's JSON, tolerant of prose around it."""
    value = parse_json_object(text) or {}
    decision = str(value.get("decision", "")).strip().upper()
    reason = value.get("reason")
    reason = reason.strip() if isinstance(reason, str) else ""
    if decision in ("A", "B"):
        return decision, reason  # type: ignore[return-value]
    grade = parse_grade(text)
    return (grade if grade in ("A", "B") else None), reason
