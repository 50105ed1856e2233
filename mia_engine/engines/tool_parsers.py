"""The names of vLLM's output parsers an engine may set, checked before any engine starts.

``engines.<name>.tool_call_parser`` (``vllm serve --enable-auto-tool-choice --tool-call-parser NAME``) and
``engines.<name>.reasoning_parser`` (``--reasoning-parser NAME``) name parsers of vLLM's registries. A name
vLLM does not register is refused by ``serve``'s preflight and again when an engine starts, with the same
one-line error naming the field (and the closest registered name). ``output_parsers.py`` runs them.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import MIAConfig

_KINDS = {"tool_call_parser": "a tool-call parser", "reasoning_parser": "a reasoning parser"}
"""An engine field naming a vLLM parser, and what it names."""


def tool_parser_names() -> list[str]:
    """The tool-call parsers the installed vLLM registers (imports vLLM's parser registry)."""
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


def reasoning_parser_names() -> list[str]:
    """The reasoning parsers the installed vLLM registers (imports vLLM's parser registry)."""
    from vllm.reasoning import ReasoningParserManager

    return ReasoningParserManager.list_registered()


def parser_error(engine: str, name: str, known: Collection[str], field: str = "tool_call_parser") -> str | None:
    """Engine ``engine``'s parser ``field`` set to ``name`` as a one-line error, or None when vLLM registers
    it (or it is empty)."""
    if not name or name in known:
        return None
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"engines.{engine}.{field}: {name!r} is not {_KINDS[field]} of vLLM{hint}"


def check_parser_names(config: MIAConfig) -> None:
    """Raise ``ValueError`` naming the first engine field (``tool_call_parser``, then ``reasoning_parser``)
    that names a parser vLLM does not register."""
    for field, names in (("tool_call_parser", tool_parser_names), ("reasoning_parser", reasoning_parser_names)):
        named = {engine: getattr(c, field) for engine, c in config.engines.items() if getattr(c, field)}
        if not named:
            continue
        known = names()
        for engine, parser in named.items():
            error = parser_error(engine, parser, known, field)
            if error is not None:
                raise ValueError(error)
