"""The Executor's turn format in its two views: the parser that reads one generation into an
``ExecutorTurn``, and the regex (vLLM structured outputs) that lets the model write only well-formed
turns. They describe one format, so they change together: every turn the regex allows must parse as
well formed (``tests/agent/test_turns.py`` checks it with hypothesis).

A well-formed turn is a think block, then one ``<tool_call>`` (a JSON ``{"name", "arguments"}``) or one
``<answer>``. The parser never raises (model output is untrusted text; see ``model_text``).
"""

from __future__ import annotations

import json
import re

import msgspec

from ..tools.calls import ToolCall
from .model_text import THINK_CLOSE, THINK_OPEN, is_think_balanced

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN = "<tool_response>"


class ExecutorTurn(msgspec.Struct, frozen=True):
    """One parsed assistant turn of the Executor."""

    raw: str
    """The generation as it came back."""
    text: str
    """What goes back into the conversation: cut before any ``<tool_response>`` and after the
    first ``</tool_call>`` (the reference's rule)."""
    think: str | None
    tool_call: ToolCall | None
    answer: str | None
    is_well_formed: bool
    """Balanced think block, then exactly one of a valid tool call or an answer."""
    tool_call_error: str | None = None
    """Why a ``<tool_call>`` block could not be parsed (the loop tells the Executor)."""


# ---- parsing ---------------------------------------------------------------------------------


def cut_executor_text(text: str) -> str:
    """Drop a hallucinated ``<tool_response>`` and everything after the first ``</tool_call>``."""
    response_at = text.find(RESPONSE_OPEN)
    if response_at >= 0:
        text = text[:response_at]
    call_at = text.find(CALL_OPEN)
    close_at = text.find(CALL_CLOSE, call_at + 1) if call_at >= 0 else -1
    if close_at >= 0:
        text = text[: close_at + len(CALL_CLOSE)]
    return text.strip()


def parse_executor_turn(raw: str) -> ExecutorTurn:
    """Parse one Executor generation; never raises (the reference crashed on bad JSON)."""
    try:
        return _parse_executor_turn(raw if isinstance(raw, str) else str(raw))
    except Exception as err:  # noqa: BLE001 - a parser bug must not kill a rollout
        return ExecutorTurn(str(raw), str(raw), None, None, None, False, f"unparseable turn: {err}")


def _parse_executor_turn(raw: str) -> ExecutorTurn:
    text = cut_executor_text(raw)
    think, think_end = _think_block(text)
    body = text[think_end:]
    call_body = _tag_body(body, CALL_OPEN, CALL_CLOSE, allow_unclosed=True)
    tool_call, error = (None, None) if call_body is None else parse_tool_call(call_body)
    answer = _tag_body(body, ANSWER_OPEN, ANSWER_CLOSE, allow_unclosed=False)
    has_one_action = (tool_call is not None) != (answer is not None) and error is None
    is_well_formed = think is not None and text.count(THINK_OPEN) == 1 and is_think_balanced(text) and has_one_action
    return ExecutorTurn(raw, text, think, tool_call, answer.strip() if answer is not None else None,
                        is_well_formed, error)


def _think_block(text: str) -> tuple[str | None, int]:
    """(think body, index after it); actions are looked for after a closed think block only."""
    start = text.find(THINK_OPEN)
    end = text.find(THINK_CLOSE, start + len(THINK_OPEN)) if start >= 0 else -1
    if start < 0 or end < 0:
        return None, 0
    return text[start + len(THINK_OPEN): end].strip(), end + len(THINK_CLOSE)


def _tag_body(text: str, open_tag: str, close_tag: str, *, allow_unclosed: bool) -> str | None:
    """Body of the first closed tag pair, taking the innermost opener (``<a><a>x</a>`` → ``x``)."""
    close_at = text.find(close_tag)
    if close_at < 0:
        open_at = text.find(open_tag)
        return text[open_at + len(open_tag):] if allow_unclosed and open_at >= 0 else None
    open_at = text.rfind(open_tag, 0, close_at)
    return text[open_at + len(open_tag): close_at] if open_at >= 0 else None


_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```\s*$")


def parse_tool_call(body: str) -> tuple[ToolCall | None, str | None]:
    """``{"name", "arguments"}`` from a tool-call body, tolerant of fences, whitespace and trailing junk."""
    start = body.find("{")
    if start < 0:
        return None, "the tool call holds no JSON object"
    try:
        # strict=False: a raw tab or other control character inside a string is what models write;
        # refusing the call over it wastes the turn
        value, _ = json.JSONDecoder(strict=False).raw_decode(_FENCE.sub("", body[start:].strip()))
    except (ValueError, RecursionError) as err:  # a model can nest brackets past the parser's stack
        return None, f"the tool call is not valid JSON ({err.args[0] if err.args else err})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"].strip():
        return None, 'the tool call needs a string "name"'
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None, '"arguments" is a string that is not JSON'
    if not isinstance(arguments, dict):
        return None, '"arguments" must be a JSON object'
    return ToolCall(value["name"].strip(), arguments), None


# ---- structured outputs ----------------------------------------------------------------------

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def executor_turn_regex(
    tool_names: list[str] | tuple[str, ...],
    *,
    max_think_chars: int = 1500,
    max_answer_chars: int = 400,
    max_query_chars: int = 200,
    max_queries: int = 4,
    allow_answer: bool = True,
) -> str:
    """A regex (vLLM structured outputs) for one well-formed Executor turn: a think block, then one
    tool call or an answer (only a tool call when ``allow_answer`` is False). Plain groups, bounded
    repeats, no lookarounds or lazy quantifiers: a subset every structured-output backend compiles."""
    calls = [_call_regex(name, max_query_chars, max_queries) for name in tool_names]
    think = rf"<think>[^<]{{1,{max_think_chars}}}</think>\n"
    # an answer starts with a visible character: small models otherwise close an empty "<answer>\n"
    answer = rf"<answer>\s{{0,2}}[^<\s][^<]{{0,{max_answer_chars - 1}}}</answer>"
    if not calls:
        return think + answer
    call = rf"<tool_call>\n({'|'.join(calls)})\n</tool_call>"
    return think + (rf"({call}|{answer})" if allow_answer else call)


def think_regex(max_think_chars: int = 1500) -> str:
    """A regex for a think block alone: the generated part of a turn whose call is fixed (the loop
    writes the call after it, ``fixed_call_turn``). One grammar for every such turn, where a regex with
    the call's text in it would be a grammar to compile, and keep in the engine's cache, per query."""
    return rf"<think>[^<]{{1,{max_think_chars}}}</think>"


def fixed_call_turn(generated: str, call_text: str) -> str:
    """A fixed turn's text: the think block the Executor generated (``think_regex``; anything after it
    dropped), a line break, then ``call_text``, the call as the loop writes it."""
    end = generated.find(THINK_CLOSE)
    think = generated[:end + len(THINK_CLOSE)] if end >= 0 else generated.rstrip()
    return f"{think}\n{call_text}"


def _call_regex(name: str, max_query_chars: int, max_queries: int) -> str:
    if not _TOOL_NAME.match(name):
        raise ValueError(f"tool name {name!r} must be letters, digits and underscores")
    prefix = rf'\{{"name": "{name}", "arguments": '
    if name == "search":
        query = rf'"[^"\\<\x00-\x1f]{{1,{max_query_chars}}}"'
        return prefix + rf'\{{"query_list": \[{query}(, {query}){{0,{max_queries - 1}}}\]\}}\}}'
    if name == "web_image_to_image_search":
        return prefix + r'\{"img_idx": "0"\}\}'
    return prefix + r'\{[^<\x00-\x1f]{0,300}\}\}'
