"""``tools`` / ``tool_choice`` on the raw roles, as ``vllm serve`` serves them.

``required`` and a named function are enforced by structured outputs (vLLM does the same for these two):
the completion is constrained to JSON (a list of ``{"name", "parameters"}`` calls, or the named function's
arguments) and always answered as ``tool_calls`` (streamed as they are generated: a call's id and name, then
its arguments piece by piece). A completion ``max_tokens`` cuts short ends with ``finish_reason`` ``length``
and the calls as far as they were generated (each call whose name was complete, its arguments cut), whole
or streamed alike, as OpenAI and vLLM answer; no 4xx can follow once a stream has started, and a whole
answer says the same as the stream would have. ``auto`` (the default when ``tools`` are given) generates
freely and the engine's tool-call parser (``EngineConfig.tool_call_parser``) reads the model's own call
syntax, streamed or whole; on an engine without one it is refused (400 naming ``tool_choice``), as
``vllm serve`` refuses it without ``--tool-call-parser``. The reading itself is vLLM's
(``engines/output_parsers.py``).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, NamedTuple

import msgspec

from ..engines.client import ParsedOutput, ParsedToolCall, ToolCallDelta
from .errors import BadRequest
from .openai_bodies import (AssistantMessage, ChatCompletionRequest, DeltaFunctionCall, DeltaToolCall, FunctionCall,
                            NamedToolChoice, Tool, ToolCall)

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
    def calls(self) -> Literal["none", "auto", "required", "named"]:
        """How the completion holds calls (``client.OutputReading.calls``)."""
        if self.parses:
            return "auto"
        if self.calls_tools:
            return "required" if self.named is None else "named"
        return "none"


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


def answer_message(mode: ToolMode, parsed: ParsedOutput, finish_reason: str | None,
                   parallel: bool | None) -> tuple[AssistantMessage, str | None]:
    """The assistant message of a whole completion (read by its engine's parsers) and its finish reason:
    ``tool_calls`` under ``required`` and under ``auto`` when calls were found, ``stop`` for a named function
    (as OpenAI and vLLM answer); a cut completion keeps ``length``."""
    reasoning = msgspec.UNSET if parsed.reasoning is None else parsed.reasoning
    if mode.calls_tools:
        calls = [ToolCall(c.id or _call_id(), FunctionCall(c.name, c.arguments)) for c in parsed.calls or []]
        reason = "tool_calls" if mode.named is None and finish_reason == "stop" else finish_reason
        return AssistantMessage(content="" if mode.named else None, tool_calls=calls,
                                reasoning_content=reasoning), reason
    found = parsed_tool_calls(parsed.calls, parallel) if mode.parses else None
    if found is None:
        return AssistantMessage(content=parsed.content, reasoning_content=reasoning), finish_reason
    return AssistantMessage(content=parsed.content, tool_calls=found, reasoning_content=reasoning), "tool_calls"


def parsed_tool_calls(calls: list[ParsedToolCall] | None, parallel: bool | None) -> list[ToolCall] | None:
    """The calls a tool-call parser read from an ``auto`` completion, as the API's (only the first with
    ``parallel_tool_calls: false``, as vLLM answers); None: it called none."""
    if not calls:
        return None
    calls = calls[:1] if parallel is False else calls
    return [ToolCall(call.id or _call_id(), FunctionCall(call.name, call.arguments)) for call in calls]


def delta_tool_calls(pieces: list[ToolCallDelta], parallel: bool | None) -> list[DeltaToolCall] | None:
    """Streamed pieces of calls as the API's (only the first call's with ``parallel_tool_calls: false``, as
    vLLM filters them); None: none."""
    calls = [DeltaToolCall(p.index, p.id, "function" if p.id else None,
                           DeltaFunctionCall(p.name, p.arguments) if p.name is not None or p.arguments is not None
                           else None)
             for p in pieces if parallel is not False or p.index == 0]
    return calls or None


def _call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"
