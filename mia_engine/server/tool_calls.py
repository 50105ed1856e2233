"""``tools`` / ``tool_choice`` on the raw roles, as ``vllm serve`` serves them.

``required`` and a named function are enforced by structured outputs (vLLM does the same for these two):
the completion is constrained to JSON (a list of ``{"name", "parameters"}`` calls, or the named function's
arguments) and turned into ``tool_calls``. ``auto`` (the default when ``tools`` are given) generates freely
and the engine's tool-call parser (``EngineConfig.tool_call_parser``) reads the model's own call syntax
out of the finished text; on an engine without one it is refused (400 naming ``tool_choice``), as
``vllm serve`` refuses it without ``--tool-call-parser``.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import msgspec

from ..engines.client import ExtractedToolCalls
from .errors import BadRequest
from .openai_bodies import ChatCompletionRequest, FunctionCall, NamedToolChoice, Tool, ToolCall

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


class ToolMode(NamedTuple):
    """How a request uses its tools: the template's tool list, the constraint, and how to read the output."""

    tools: list[dict[str, Any]] | None
    """The function definitions for the chat template (None: no tools)."""
    schema: dict | None
    """The JSON schema the completion is constrained to (None: free text)."""
    named: str | None
    """The forced function's name (its arguments are the whole completion)."""
    parses: bool = False
    """``auto``: free text, its calls read by the engine's tool-call parser."""

    @property
    def calls_tools(self) -> bool:
        """The completion is constrained to calls (``required`` or a named function)."""
        return self.schema is not None

    @property
    def is_read_whole(self) -> bool:
        """The completion becomes ``tool_calls`` only once it is whole (a stream sends it at its end)."""
        return self.calls_tools or self.parses


NO_TOOLS = ToolMode(None, None, None)


def tool_mode(request: ChatCompletionRequest, *, can_parse: bool) -> ToolMode:
    """Validate ``tools``/``tool_choice`` (and refuse the deprecated ``functions``/``function_call``);
    ``can_parse``: the model's engine has a tool-call parser, so ``auto`` is served."""
    if request.functions is not None:
        raise BadRequest("`functions` is deprecated and not supported; send `tools`.", param="functions")
    if request.function_call is not None:
        raise BadRequest("`function_call` is deprecated and not supported; send `tool_choice`.",
                         param="function_call")
    choice, tools = request.tool_choice, request.tools
    if not tools:
        if choice is not None and choice != "none":
            raise BadRequest("tool_choice needs a non-empty `tools` list.", param="tool_choice")
        return NO_TOOLS
    definitions = [msgspec.to_builtins(tool) for tool in tools]
    if choice is None or choice == "auto":
        if can_parse:
            return ToolMode(definitions, None, None, parses=True)
        raise BadRequest(
            f'tool_choice "auto" (the default when `tools` are given) needs a tool-call parser, and the engine '
            f'of `{request.model}` has none (engines.<name>.tool_call_parser); send tool_choice "required", a '
            'named function ({"type": "function", "function": {"name": ...}}) or "none".', param="tool_choice")
    if choice == "none":
        return ToolMode(definitions, None, None)
    if request.structured_outputs is not None or (request.response_format and request.response_format.type != "text"):
        raise BadRequest("tool_choice (required or a named function) cannot be combined with structured_outputs "
                         "or response_format.", param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        tool = next((t for t in tools if t.function.name == choice.function.name), None)
        if tool is None:
            raise BadRequest(f"tool_choice names the function `{choice.function.name}`, which is not in `tools`.",
                             param="tool_choice")
        return ToolMode(definitions, _parameters(tool), tool.function.name)
    return ToolMode(definitions, _required_schema(tools, request.parallel_tool_calls), None)


def _parameters(tool: Tool) -> dict:
    return tool.function.parameters or _EMPTY_OBJECT


def _required_schema(tools: list[Tool], parallel: bool | None) -> dict:
    """A non-empty list of calls, each one of the tools with arguments of its schema (vLLM's schema)."""
    options = [{"properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": _parameters(t)},
                "required": ["name", "parameters"]} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": options}}
    if parallel is False:
        schema["maxItems"] = 1
    return schema


def parse_tool_calls(mode: ToolMode, text: str) -> list[ToolCall] | None:
    """The calls in a constrained completion; None when the text is not a whole call (e.g. cut by
    ``max_tokens``), in which case the text is returned as content."""
    if mode.named is not None:
        try:
            msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError):
            return None
        return [ToolCall(_call_id(), FunctionCall(mode.named, text))]
    try:
        calls = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(calls, list):
        return None
    result = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        arguments = msgspec.json.encode(call.get("parameters", {})).decode()
        result.append(ToolCall(_call_id(), FunctionCall(call["name"], arguments)))
    return result


def parsed_tool_calls(found: ExtractedToolCalls, parallel: bool | None) -> list[ToolCall] | None:
    """The calls a tool-call parser read from an ``auto`` completion, as the API's (only the first with
    ``parallel_tool_calls: false``, as vLLM answers); None: it called none."""
    if not found.calls:
        return None
    calls = found.calls[:1] if parallel is False else found.calls
    return [ToolCall(call.id or _call_id(), FunctionCall(call.name, call.arguments)) for call in calls]


def _call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"
