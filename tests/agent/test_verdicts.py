"""The judges' outputs parsed from model text: the grader's letter, a review, the Area Chair's decision."""

from __future__ import annotations

import pytest

from mia_engine.agent.verdicts import parse_area_chair, parse_grade, parse_review


@pytest.mark.parametrize("text, label", [
    ("A", "A"), ("  b\n", "B"), ("<think>close call</think>C", "C"), ('{"grade": "A"}', "A"),
    ("The grade is B.", "B"), ("garbage", None), ("", None),
])
def test_grade(text, label):
    assert parse_grade(text) == label


def test_review_parsing():
    review = parse_review("logic", 'Here: {"score": 7, "reason": "Sound chain."} done')
    assert (review.kind, review.score, review.reason) == ("logic", 7, "Sound chain.")
    assert parse_review("sourcing", "score: 3 because it invented a date").score == 3
    assert parse_review("validity", '{"score": 42, "reason": "x"}').score is None
    assert parse_review("validity", "garbage").score is None


def test_area_chair_parsing():
    assert parse_area_chair('{"reason": "hallucinated date", "decision": "B"}') == ("B", "hallucinated date")
    assert parse_area_chair("A") == ("A", "")
    assert parse_area_chair("C")[0] is None  # the Area Chair only decides A or B
    assert parse_area_chair("no idea")[0] is None
