"""What the Executor and its tools exchange: a parsed ``ToolCall`` in, an ``Observation`` out, and the
word cut applied to observation text (the tools cut their results; the loop cuts traces the same way).

The agent's turn parser builds ``ToolCall`` values; the registry answers them with ``Observation`` values
that the loop wraps in ``<tool_response>`` for the Executor.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec


class ToolCall(msgspec.Struct, frozen=True):
    """One call the Executor asked for: ``{"name": ..., "arguments": {...}}``."""

    name: str
    arguments: dict[str, Any] = {}


class Observation(msgspec.Struct, frozen=True):
    """What a tool returned, as the Executor will read it inside ``<tool_response>``."""

    text: str
    is_success: bool
    tool: str = ""
    images: list[str] = []
    """Image files to show the Executor with the text (image search)."""


def truncate_words(text: str, max_words: int, marker: str = " ... (truncated)") -> str:
    """The first ``max_words`` whitespace-separated words, keeping the original line breaks; 0 = all."""
    if max_words <= 0:
        return text
    for count, word in enumerate(re.finditer(r"\S+", text), 1):
        if count == max_words + 1:
            return text[: word.start()].rstrip() + marker
    return text
