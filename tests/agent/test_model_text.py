"""Reading model text: the visible part after the think block, and random text that no parser of model
output may raise on."""

from __future__ import annotations

import random

from mia_engine.agent.model_text import strip_think
from mia_engine.agent.plan_decisions import parse_plan_choice, parse_yes_no
from mia_engine.agent.turns import ExecutorTurn, parse_executor_turn
from mia_engine.agent.verdicts import parse_area_chair, parse_grade, parse_review


def _random_text(rng: random.Random) -> str:
    atoms = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<tool_response>",
             "{", "}", "[", "]", '"', ":", ",", "\\", "\n", " ", '"name"', '"arguments"', '"search"', "null",
             "\x00", "é", "😀", "{\"name\": \"search\", \"arguments\": {\"query_list\": [\"q\"]}}"]
    pieces = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.6:
            pieces.append(rng.choice(atoms))
        else:
            pieces.append("".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 8))))
    return "".join(pieces)


def test_fuzz_never_raises():
    rng = random.Random(1234)
    for _ in range(600):
        text = _random_text(rng)
        turn = parse_executor_turn(text)
        assert isinstance(turn, ExecutorTurn)
        assert turn.tool_call is None or isinstance(turn.tool_call.arguments, dict)
        parse_yes_no(text)
        parse_plan_choice(text, 4)
        parse_grade(text)
        parse_review("logic", text)
        parse_area_chair(text)
    assert isinstance(parse_executor_turn(None), ExecutorTurn)  # type: ignore[arg-type]


def test_strip_think():
    assert strip_think("<think>a</think> b ") == "b"
    assert strip_think("plain") == "plain"
    # thinking cut off by the budget is not visible text (it used to leak into plans and answers)
    assert strip_think("<think>unfinished") == ""
    assert strip_think("before <think>unfinished") == "before"
    assert strip_think("<think>a</think> plan <think>again, unfinished") == "plan"
