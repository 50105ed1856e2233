"""vLLM's tool-call parsers, for ``tool_choice: "auto"`` on an engine with ``tool_call_parser`` set.

As ``vllm serve --enable-auto-tool-choice --tool-call-parser NAME`` does: the model generates freely (its
chat template told it about the tools) and the named parser reads its own call syntax (Hermes'
``<tool_call>{...}</tool_call>`` for Qwen) out of the finished text. The name is checked against vLLM's
registry before any engine starts (``serve``'s preflight) and again when an engine's parser is built, with
the same one-line error naming ``engines.<name>.tool_call_parser``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from .client import ExtractedToolCalls, ParsedToolCall

if TYPE_CHECKING:
    from ..config import MIAConfig


def tool_parser_names() -> list[str]:
    """The tool-call parsers the installed vLLM registers (imports vLLM's parser registry)."""
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


def parser_error(engine: str, name: str, known: Collection[str]) -> str | None:
    """Engine ``engine``'s ``tool_call_parser`` as a one-line error, or None when vLLM registers it."""
    if not name or name in known:
        return None
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"engines.{engine}.tool_call_parser: {name!r} is not a tool-call parser of vLLM{hint}"


def check_tool_call_parsers(config: MIAConfig) -> None:
    """Raise ``ValueError`` naming the first engine whose ``tool_call_parser`` vLLM does not register."""
    named = {name: engine.tool_call_parser for name, engine in config.engines.items() if engine.tool_call_parser}
    if not named:
        return
    known = tool_parser_names()
    for engine, parser in named.items():
        error = parser_error(engine, parser, known)
        if error is not None:
            raise ValueError(error)


class ToolCallParser:
    """One engine's vLLM tool-call parser class with the engine's tokenizer. vLLM's parsers keep state
    while they read a text, so each ``extract`` builds a fresh one (as vLLM does per request and choice)."""

    def __init__(self, engine: str, name: str, tokenizer: Any) -> None:
        from vllm.tool_parsers import ToolParserManager

        error = parser_error(engine, name, ToolParserManager.list_registered())
        if error is not None:
            raise ValueError(error)
        self.name = name
        self._parser_cls = ToolParserManager.get_tool_parser(name)
        self._tokenizer = tokenizer

    def skips_special_tokens(self, tools: list[dict[str, Any]]) -> bool:
        """Whether the completion may be detokenized without special tokens: a parser whose call tags are
        special tokens in some models (Hermes) asks for them to be kept, as it does in ``vllm serve``."""
        request = _request(tools)
        return bool(self._parser_cls(self._tokenizer, request.tools).adjust_request(request).skip_special_tokens)

    def extract(self, text: str, tools: list[dict[str, Any]]) -> ExtractedToolCalls:
        """The calls in a finished completion, and the content around them (None when only whitespace is
        left, as vLLM answers); no calls: the text unchanged as content."""
        request = _request(tools)
        found = self._parser_cls(self._tokenizer, request.tools).extract_tool_calls(text, request)
        if not found.tools_called:
            return ExtractedToolCalls(text, [])
        calls = [ParsedToolCall(call.function.name, call.function.arguments, call.id) for call in found.tool_calls]
        content = found.content if found.content and found.content.strip() else None
        return ExtractedToolCalls(content, calls)


def _request(tools: list[dict[str, Any]]) -> Any:
    """The vLLM request a parser reads: the tools and ``tool_choice: "auto"`` (parsers read no messages)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[], tools=tools, tool_choice="auto")
