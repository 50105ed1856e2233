"""Typed messages of the research loop and the parsers that turn model text into them.

Model output is untrusted text: every parser here returns a value (a default when the text is
garbage) and never raises, so one malformed generation cannot take down a batch of rollouts.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import msgspec

from ..tools.calls import Observation, ToolCall

Label = Literal["A", "B", "C"]
"""SimpleQA grades: A correct, B incorrect, C not attempted (the Area Chair uses A/B)."""
VerdictSource = Literal["supervised", "unsupervised"]
ReviewerKind = Literal["logic", "sourcing", "validity"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
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


class PlannerTokens(msgspec.Struct, frozen=True):
    """The Planner's share of one rollout in token space, as the learner trains on it (MIA Eq. 3: the
    Planner's own tokens only). ``completion_ids`` is everything after the prompt, in order: the plan,
    the template's turn between it and the reflection question, the yes/no, then the replan request and
    the replan; ``completion_mask`` is 1 where the Planner sampled the token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]


class Trajectory(msgspec.Struct, frozen=True):
    """One Executor run under one plan, with the Planner's reflection and replan."""

    turns: list[ExecutorTurn]
    observations: list[Observation | None]
    """Aligned with ``turns``: the tool result that followed each turn (None when none)."""
    first_answer: str | None
    """Answer before any replan (the reward's acc(first)): the Executor's own, or with
    ``agent.answer_from = "evidence"`` the one read off its passages."""
    final_answer: str | None
    """Answer returned to the user (equal to ``first_answer`` without a replan)."""
    reflection: str = ""
    """The Planner's raw yes/no generation ("" when the reflection step did not run)."""
    replan: str = ""
    """The Planner's replan as the Executor read it, its thinking stripped ("" without a replan)."""
    did_replan: bool = False
    replan_turn: int = -1
    """Index of the first turn run under the replan; -1 without one."""
    num_tool_calls: int = 0
    num_successful_tool_calls: int = 0
    planner: PlannerTokens | None = None
    """The Planner's tokens for the learner (None when the engine gave no token ids)."""

    @property
    def length(self) -> tuple[int, int]:
        """(turns, characters): the shortest successful trajectory becomes the positive memory."""
        return len(self.turns), sum(len(turn.text) for turn in self.turns)


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


class Timings(msgspec.Struct, frozen=True):
    """Seconds spent per stage of one rollout."""

    plan_s: float = 0.0
    execute_s: float = 0.0
    reflect_s: float = 0.0
    judge_s: float = 0.0


class Rollout(msgspec.Struct, frozen=True):
    """One of a question's G rollouts: plan → trajectory → verdict → reward."""

    plan: str
    """The Planner's raw plan generation (think block included: the format reward checks it)."""
    trajectory: Trajectory
    verdict: Verdict | None = None
    first_verdict: Verdict | None = None
    """Verdict on the first answer when it differs from the final one (None = same as ``verdict``)."""
    reward: float = 0.0
    advantage: float = 0.0
    timings: Timings = Timings()

    @property
    def is_correct(self) -> bool:
        return self.verdict is not None and self.verdict.is_correct

    @property
    def length(self) -> tuple[int, int]:
        """The trajectory's (turns, characters): the shortest success becomes the positive memory."""
        return self.trajectory.length


# ---- parsing ---------------------------------------------------------------------------------


def strip_think(text: str) -> str:
    """A reasoning model's visible text: what follows the last ``</think>`` (the reference's
    ``extract_after_think``). Thinking cut off by the token budget (an unclosed ``<think>``) is hidden
    too: only what came before it is visible."""
    close_at, open_at = text.rfind(THINK_CLOSE), text.rfind(THINK_OPEN)
    if open_at > close_at:
        return text[:open_at].strip() if close_at < 0 else text[close_at + len(THINK_CLOSE): open_at].strip()
    return text[close_at + len(THINK_CLOSE):].strip() if close_at >= 0 else text.strip()


def is_think_balanced(text: str) -> bool:
    """As many ``<think>`` as ``</think>`` (the reference's format check)."""
    return text.count(THINK_OPEN) == text.count(THINK_CLOSE)


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
    except ValueError as err:
        return None, f"the tool call is not valid JSON ({err.args[0] if err.args else err})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"].strip():
        return None, 'the tool call needs a string "name"'
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None, '"arguments" is a string that is not JSON'
    if not isinstance(arguments, dict):
        return None, '"arguments" must be a JSON object'
    return ToolCall(value["name"].strip(), arguments), None


def answer_or_text(turn: ExecutorTurn) -> str:
    """The reference's fallback: the ``<answer>`` body, else the turn's text after its think block."""
    return turn.answer if turn.answer is not None else strip_think(turn.text)


def parse_yes_no(text: str) -> bool | None:
    """The reflection decision: True = replan; the first yes/no word counts; None when neither appears."""
    visible = strip_think(text if isinstance(text, str) else "").lower()
    match = re.search(r"\b(yes|no)\b", visible)
    return None if match is None else match.group(1) == "yes"


def is_exact_yes_no(text: str) -> bool:
    """The format reward's test: after the think block the answer is exactly "yes" or "no"."""
    return strip_think(text if isinstance(text, str) else "").lower() in ("yes", "no")


def parse_plan_choice(text: str, num_plans: int) -> int:
    """The Router's pick as a 0-based index; prompts number plans from 1; 0 when nothing valid is found."""
    if num_plans <= 1 or not isinstance(text, str):
        return 0
    visible = strip_think(text)
    value = _json_object(visible)
    candidates: list[Any] = [value.get("plan"), value.get("choice")] if value else []
    candidates += re.findall(r"plan\s*#?\s*(\d+)", visible, flags=re.IGNORECASE)
    candidates += re.findall(r"\d+", visible)
    for candidate in candidates:
        number = _as_int(candidate)
        if number is not None and 1 <= number <= num_plans:
            return number - 1
    return 0


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (models wrap JSON in prose and fences)."""
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def parse_json_object(text: str) -> dict[str, Any] | None:
    """Public form of the JSON-object finder, after the think block; None on garbage."""
    return _json_object(strip_think(text)) if isinstance(text, str) else None


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
    fixed_query: str | None = None,
) -> str:
    """A regex (vLLM structured outputs) for one well-formed Executor turn: a think block, then one
    tool call or an answer (only a tool call when ``allow_answer`` is False; only a search for exactly
    ``fixed_query`` when given). Plain groups, bounded repeats, no lookarounds or lazy quantifiers: a
    subset every structured-output backend compiles."""
    if fixed_query is not None:
        literal = _regex_literal(json.dumps(fixed_query, ensure_ascii=False))
        search = rf'\{{"name": "search", "arguments": \{{"query_list": \[{literal}\]\}}\}}'
        return rf"<think>[^<]{{1,{max_think_chars}}}</think>\n<tool_call>\n{search}\n</tool_call>"
    calls = [_call_regex(name, max_query_chars, max_queries) for name in tool_names]
    think = rf"<think>[^<]{{1,{max_think_chars}}}</think>\n"
    # an answer starts with a visible character: small models otherwise close an empty "<answer>\n"
    answer = rf"<answer>\s{{0,2}}[^<\s][^<]{{0,{max_answer_chars - 1}}}</answer>"
    if not calls:
        return think + answer
    call = rf"<tool_call>\n({'|'.join(calls)})\n</tool_call>"
    return think + (rf"({call}|{answer})" if allow_answer else call)


def _regex_literal(text: str) -> str:
    """``text`` matched literally; only regex metacharacters are escaped (``re.escape`` also escapes
    spaces and other characters that not every structured-output backend accepts escaped)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


_REGEX_META = frozenset("\\.^$*+?{}[]()|/")


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


def plan_choice_schema(num_plans: int) -> dict[str, Any]:
    """JSON schema of the Router's pick, plans numbered from 1."""
    return {
        "type": "object",
        "properties": {"plan": {"type": "integer", "enum": list(range(1, max(num_plans, 1) + 1))}},
        "required": ["plan"],
        "additionalProperties": False,
    }


def parse_grade(text: str) -> Label | None:
    """The grader's letter: the whole visible output, a JSON ``grade``, or a lone A/B/C; None on garbage."""
    if not isinstance(text, str):
        return None
    visible = strip_think(text).strip().strip("\"'`*.() ").upper()
    if visible in ("A", "B", "C"):
        return visible  # type: ignore[return-value]
    value = _json_object(strip_think(text))
    letter = str(value.get("grade", value.get("decision", ""))).strip().upper() if value else ""
    if letter in ("A", "B", "C"):
        return letter  # type: ignore[return-value]
    match = re.search(r"\b(?:grade|answer|letter)\s*(?:is)?\s*[:=]?\s*\(?([ABC])\b", strip_think(text), re.IGNORECASE)
    return match.group(1).upper() if match else None  # type: ignore[return-value]


def parse_review(kind: ReviewerKind, text: str) -> Review:
    """A reviewer's JSON ``{"score", "reason"}``; score None when it cannot be read."""
    value = parse_json_object(text) or {}
    score = _as_int(value.get("score"))
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
