"""The Executor's turn format: parsing well-formed, malformed, truncated and nested turns, and the
structured-output regex (whatever it lets through must parse as well formed)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mia_engine.agent.executor_run import call_text
from mia_engine.agent.turns import executor_turn_regex, fixed_call_turn, parse_executor_turn, think_regex
from mia_engine.tools.calls import ToolCall

CALL = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["capital of Peru"]}}\n</tool_call>'


def test_well_formed_tool_call():
    turn = parse_executor_turn(f"<think>I need to look it up.</think>\n{CALL}")
    assert turn.tool_call == ToolCall("search", {"query_list": ["capital of Peru"]})
    assert turn.think == "I need to look it up."
    assert turn.answer is None and turn.tool_call_error is None
    assert turn.is_well_formed


def test_well_formed_answer():
    turn = parse_executor_turn("<think>The passage says Lima.</think>\n<answer> Lima </answer>")
    assert turn.answer == "Lima" and turn.tool_call is None and turn.is_well_formed


def test_text_is_cut_after_first_tool_call_and_before_tool_response():
    raw = f"<think>x</think>{CALL}<tool_call>{{\"name\": \"other\"}}</tool_call><answer>no</answer>"
    turn = parse_executor_turn(raw)
    assert turn.text.endswith("</tool_call>") and turn.text.count("<tool_call>") == 1
    assert turn.answer is None and turn.tool_call.name == "search"
    hallucinated = parse_executor_turn("<think>x</think><answer>A</answer><tool_response>fake</tool_response>")
    assert "fake" not in hallucinated.text and hallucinated.answer == "A"


def test_tool_call_json_tolerates_fences_whitespace_and_trailing_junk():
    raw = '<think>t</think><tool_call>```json\n  {"name": "search", "arguments": {"query_list": ["a"]}} }} junk\n```</tool_call>'
    turn = parse_executor_turn(raw)
    assert turn.tool_call == ToolCall("search", {"query_list": ["a"]})


def test_arguments_given_as_a_json_string_are_decoded():
    raw = '<think>t</think><tool_call>{"name": "search", "arguments": "{\\"query_list\\": [\\"a\\"]}"}</tool_call>'
    assert parse_executor_turn(raw).tool_call == ToolCall("search", {"query_list": ["a"]})


@pytest.mark.parametrize("body, reason", [
    ("not json at all", "no JSON object"),
    ('{"name": "search", "arguments": ', "not valid JSON"),
    ('{"arguments": {}}', '"name"'),
    ('{"name": "search", "arguments": [1, 2]}', '"arguments" must be'),
    ('{"name": "", "arguments": {}}', '"name"'),
])
def test_malformed_tool_calls_report_why(body, reason):
    turn = parse_executor_turn(f"<think>t</think><tool_call>{body}</tool_call>")
    assert turn.tool_call is None and reason in turn.tool_call_error
    assert not turn.is_well_formed


def test_truncated_generations():
    unclosed_call = parse_executor_turn('<think>t</think><tool_call>{"name": "search", "arguments": {"query_list": ["a"]}}')
    assert unclosed_call.tool_call == ToolCall("search", {"query_list": ["a"]})  # the JSON itself is whole
    cut_json = parse_executor_turn('<think>t</think><tool_call>{"name": "sea')
    assert cut_json.tool_call is None and cut_json.tool_call_error
    cut_answer = parse_executor_turn("<think>t</think><answer>Lim")
    assert cut_answer.answer is None and not cut_answer.is_well_formed
    cut_think = parse_executor_turn("<think>still thinking")
    assert cut_think.think is None and cut_think.answer is None and not cut_think.is_well_formed


def test_nested_tags_take_the_innermost():
    turn = parse_executor_turn("<think>t</think><answer><answer>Lima</answer></answer>")
    assert turn.answer == "Lima"
    call = parse_executor_turn('<think>t</think><tool_call><tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert call.tool_call == ToolCall("search", {})


def test_tags_inside_the_think_block_are_not_actions():
    turn = parse_executor_turn("<think>I could write <answer>X</answer> later</think><answer>Y</answer>")
    assert turn.answer == "Y"


def test_not_well_formed_without_think_or_with_two_actions_or_unbalanced_tags():
    assert not parse_executor_turn("<answer>Lima</answer>").is_well_formed
    assert not parse_executor_turn(f"<think>t</think><answer>Lima</answer>{CALL}").is_well_formed
    assert not parse_executor_turn("<think>a</think><think>b</think><answer>x</answer>").is_well_formed
    assert not parse_executor_turn("<think>a</think></think><answer>x</answer>").is_well_formed


# ---- structured-output regex ---------------------------------------------------------------

REGEX = executor_turn_regex(["search", "web_image_to_image_search"], max_think_chars=200, max_answer_chars=50,
                            max_query_chars=40, max_queries=3)


@pytest.mark.parametrize("text", [
    "<think>I need the capital.</think>\n" + CALL,
    '<think>two queries</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["a b", "c"]}}\n</tool_call>',
    '<think>look at the image</think>\n<tool_call>\n{"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}\n</tool_call>',
    "<think>The passage says\nLima.</think>\n<answer>Lima</answer>",
])
def test_regex_accepts_well_formed_turns(text):
    assert re.fullmatch(REGEX, text)
    assert parse_executor_turn(text).is_well_formed  # whatever the regex lets through parses cleanly


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.from_regex(REGEX, fullmatch=True))
def test_every_turn_the_regex_allows_parses_as_well_formed(text):
    """What structured outputs let the model write must parse (a query with a raw control character
    once did not: valid per the regex, invalid JSON, and the turn was lost)."""
    turn = parse_executor_turn(text)
    assert turn.is_well_formed, (text, turn.tool_call_error)


def test_a_raw_control_character_in_a_query_is_read_not_refused():
    turn = parse_executor_turn('<think>t</think>\n<tool_call>\n{"name": "search", "arguments": '
                               '{"query_list": ["a\tb\x08c"]}}\n</tool_call>')
    assert turn.tool_call == ToolCall("search", {"query_list": ["a\tb\x08c"]})


@pytest.mark.parametrize("text", [
    "<answer>Lima</answer>",                                                      # no think
    "<think>t</think>\n<answer>Lima</answer><answer>again</answer>",              # two actions
    "<think>t</think>\n<answer>" + "x" * 51 + "</answer>",                          # too long
    "<think>t</think>\n<answer>\n</answer>",                                       # empty answer
    "<think>t</think>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query_list\": []}}\n</tool_call>",
    "<think>t</think>\n<tool_call>\n{\"name\": \"python\", \"arguments\": {}}\n</tool_call>",  # unknown tool
    '<think>t</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["a", "b", "c", "d"]}}\n</tool_call>',
    "<think>t <answer>x</answer></think>\n<answer>y</answer>",                    # tag inside think
    "<think>t</think>\n" + CALL + "\ntrailing",
    '<think>t</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["a\x08b"]}}\n</tool_call>',
])
def test_regex_rejects_malformed_turns(text):
    assert re.fullmatch(REGEX, text) is None


TRICKY_QUESTION = 'Who wrote "Les Misérables" (1862)? [a.k.a. Les Mis] 50% / 2*3+1 {x} | a\\b ^$'


@pytest.mark.parametrize("question", ["Which river flows through Paris?", TRICKY_QUESTION])
def test_a_fixed_call_turn_is_the_generated_think_block_then_the_written_call(question):
    """The Executor generates only the think block of a turn whose call is fixed (one regex for every
    query); the loop writes the call after it, and the turn parses to exactly that call."""
    call = ToolCall("search", {"query_list": [question]})
    assert re.fullmatch(think_regex(50), "<think>search first</think>")
    assert re.fullmatch(think_regex(50), "<think>search first</think>\n" + CALL) is None
    turn = fixed_call_turn("<think>search first</think>", call_text(call))
    assert turn == ("<think>search first</think>\n<tool_call>\n"
                    + json.dumps({"name": "search", "arguments": {"query_list": [question]}}, ensure_ascii=False)
                    + "\n</tool_call>")
    assert parse_executor_turn(turn).tool_call == call
    # whatever a looser engine wrote after the think block is dropped, not read as the call
    assert parse_executor_turn(fixed_call_turn("<think>t</think>\n" + CALL, call_text(call))).tool_call == call


def test_regex_without_tools_allows_only_answers_and_checks_names():
    only_answer = executor_turn_regex([])
    assert re.fullmatch(only_answer, "<think>t</think>\n<answer>a</answer>")
    assert re.fullmatch(only_answer, "<think>t</think>\n" + CALL) is None
    with pytest.raises(ValueError):
        executor_turn_regex(["bad name"])
