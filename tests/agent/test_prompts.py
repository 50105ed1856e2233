"""Every template renders with exactly its declared fields; the reference's fixed sentences are verbatim."""

from __future__ import annotations

import json
import re

import pytest

from mia_engine.agent import prompts
from mia_engine.agent.turns import parse_executor_turn
from mia_engine.agent.verdicts import Review
from mia_engine.tools.calls import Observation, truncate_words


@pytest.mark.parametrize("template", prompts.TEMPLATES, ids=lambda t: t.name)
def test_each_template_renders_with_its_fields_and_refuses_a_missing_one(template):
    values = {field: f"<{field}-value>" for field in template.fields}
    text = template.render(**values)
    assert all(value in text for value in values.values())
    assert re.search(r"\{[a-z_]+\}", text) is None  # no placeholder left behind
    for missing in template.fields:
        partial = {k: v for k, v in values.items() if k != missing}
        with pytest.raises(prompts.TemplateError, match=missing):
            template.render(**partial)
    with pytest.raises(prompts.TemplateError, match="unknown"):
        template.render(**values, not_a_field=1)


def test_declared_fields():
    assert prompts.PLAN.fields == {"question", "memories", "max_words", "caption_block"}
    assert prompts.GUIDE.fields == {"plan"}
    assert prompts.REPLAN_CONTINUATION.fields == {"replan"}
    assert prompts.REVIEW_VALIDITY.fields == {"question", "prediction", "max_words"}  # no trajectory
    assert {"w_logic", "w_sourcing", "w_validity"} <= prompts.AREA_CHAIR.fields


def test_reference_sentences_are_verbatim():
    assert prompts.GUIDE.render(plan="P") == "\nHere is a guide for your reference:\nP\nBegin your answer:\n"
    assert prompts.REPLAN_CONTINUATION.render(replan="R") == (
        "I have a revised plan for you to follow:\nR\nPlease continue with this updated guidance:\n")


def test_executor_prompt_holds_tools_question_and_guide():
    schema = {"type": "function", "function": {"name": "search", "parameters": {}}}
    text = prompts.render_executor_prompt([schema], "What is the capital of Peru?", "1. Search it.")
    assert "<tools>\n" + json.dumps(schema) + "\n</tools>" in text
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in text
    assert text.endswith("What is the capital of Peru?\n\nHere is a guide for your reference:\n1. Search it.\n"
                         "Begin your answer:\n")
    assert "Here is a guide" not in prompts.render_executor_prompt([schema], "Q?", None)


def test_plan_prompt_and_memories():
    memories = prompts.render_memories([("Q1", "1. **search** (q → docs)")], [("Q2", "1. **guess** (q → wrong)")])
    assert memories.index(prompts.POSITIVE_HEADING) < memories.index(prompts.NEGATIVE_HEADING)
    assert "Positive Examples (Successful Strategies)" in memories
    assert "Negative Examples (Failure Lessons)" in memories
    text = prompts.render_plan_prompt("Q?", memories, 400, caption="a red bridge")
    assert "at most 400 words" in text and "a red bridge" in text and "memory-based planning assistant" in text
    assert "Negative" not in prompts.render_memories([("Q1", "w")], [])
    assert prompts.render_memories([], []) == prompts.NO_MEMORIES


def test_trace_has_rounds_and_truncated_tool_results():
    turns = [parse_executor_turn('<think>a</think><tool_call>{"name": "search", "arguments": {}}</tool_call>'),
             parse_executor_turn("<think>b</think><answer>Lima</answer>")]
    observations = [Observation("one two three four five", True), None]
    trace = prompts.render_trace("Q?", turns, observations, max_words=3)
    assert trace.startswith("### Question: Q?\n### Round 1:\n#### Agent Reasoning and Tool Call:\n")
    assert "#### Tool Call Return Results:\none two three ... (truncated)" in trace
    assert "### Round 2:" in trace and trace.count("Tool Call Return Results") == 1


def test_truncate_words_keeps_line_breaks():
    assert truncate_words("a b\nc d", 3) == "a b\nc ... (truncated)"
    assert truncate_words("a b", 2) == "a b"
    assert truncate_words("", 2) == ""


def test_router_and_reviews_rendering():
    plans = prompts.render_plans(["p one", "p two"])
    assert plans.startswith("Plan 1:\np one") and "Plan 2:\np two" in plans
    examples = prompts.render_router_examples([("past q", "good plan", "bad plan")])
    assert "A plan that succeeded:\ngood plan" in examples and "A plan that failed:\nbad plan" in examples
    assert prompts.render_router_examples([]) == prompts.NO_ROUTER_EXAMPLES
    reviews = prompts.render_reviews([Review("logic", 8, "ok"), Review("sourcing", None, "")])
    assert '"score": 8' in reviews and "Information Sourcing" in reviews
