"""The Planner's reflection (yes/no) and the Router's plan pick, parsed from model text."""

from __future__ import annotations

import pytest

from mia_engine.agent.plan_decisions import is_exact_yes_no, parse_plan_choice, parse_yes_no


@pytest.mark.parametrize("text, decision, exact", [
    ("yes", True, True), ("No", False, True), ("<think>hmm</think>\nno", False, True),
    ("Yes, replan.", True, False), ("I think no.", False, False), ("maybe", None, False), ("", None, False),
    ("<think>yes</think>", None, False),
])
def test_yes_no(text, decision, exact):
    assert parse_yes_no(text) is decision
    assert is_exact_yes_no(text) is exact


@pytest.mark.parametrize("text, expected", [
    ("2", 1), ('{"plan": 3}', 2), ("<think>Plan 1 is weak</think>I choose Plan 4.", 3), ("Plan #2 is best", 1),
    ("plan 9", 0), ("none of them", 0), ('{"plan": true}', 0), ("0", 0),
])
def test_plan_choice(text, expected):
    assert parse_plan_choice(text, 4) == expected


def test_plan_choice_with_one_plan_is_zero():
    assert parse_plan_choice("2", 1) == 0
