"""Reading a reasoning model's text: the visible part after its think block, and the first JSON object
in the prose around it.

On an engine with a reasoning parser (``engines.<name>.reasoning_parser``) the loop reads each free-text
completion after the thinking as that parser splits it off, the chat API's way (``llm.Completion.after_thinking``);
``strip_think`` then finds no think block in it. Without one (the small models), ``strip_think`` alone decides.

Model output is untrusted text: every parser of it (here and in ``turns``, ``verdicts`` and
``plan_decisions``) returns a value (a default when the text is garbage) and never raises, so one
malformed generation cannot take down a batch of rollouts.
"""

from __future__ import annotations

import json
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


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


def as_int(value: Any) -> int | None:
    """A JSON integer or a string of digits as an int (a bool is not one); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (models wrap JSON in prose and fences)."""
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
        except (ValueError, RecursionError):  # a model can nest brackets past the parser's stack
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def parse_json_object(text: str) -> dict[str, Any] | None:
    """``first_json_object`` of the text after the think block; None on garbage."""
    return first_json_object(strip_think(text)) if isinstance(text, str) else None
