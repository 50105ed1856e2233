"""vLLM's output parsers reading an engine's chat completions, as ``vllm serve`` reads them.

An engine's ``reasoning_parser`` (``--reasoning-parser``) splits a reasoning model's thinking off into
``reasoning_content``; its ``tool_call_parser`` (``--tool-call-parser``) reads ``tool_choice: "auto"``'s calls
out of the content after the thinking. vLLM's ``ParserManager`` composes the two into one ``vllm.parser.Parser``
class (per combination a request needs: a prompt that already ended the thinking, or a request without
``auto`` tools, reads with less). A whole completion is read with ``Parser.parse``, a stream piece by piece
with ``Parser.parse_delta`` (one parser per choice: they keep state), exactly as vLLM's chat serving calls them.
``tool_choice`` ``required`` and a named function are forced to JSON by a grammar (``server/tool_calls.py``);
their calls are read from the content with vLLM's own streaming readers of that JSON, whole or piece by piece,
so a stream sends a call's id and name first and then its arguments as they are generated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .client import ChoiceReader, OutputDelta, OutputReading, ParsedOutput, ParsedToolCall, ToolCallDelta
from .tool_parsers import parser_error, reasoning_parser_names, tool_parser_names

T = TypeVar("T")
Runner = Callable[[Callable[[Any], T]], Awaitable[T]]
"""Runs work off the event loop (``VLLMEngine.with_tokenizer``): reading a whole completion is CPU work."""


class EngineParsers:
    """One engine's parsers (its ``reasoning_parser`` and ``tool_call_parser``, either may be empty). Built
    when the engine is up: vLLM checks each composed class against the engine's tokenizer (a reasoning
    parser whose think tags the vocabulary lacks is refused, naming the field)."""

    def __init__(self, engine: str, tool_call_parser: str, reasoning_parser: str, tokenizer: Any) -> None:
        from vllm.tokenizers.hf import get_cached_tokenizer

        for field, name, known in (("tool_call_parser", tool_call_parser, tool_parser_names),
                                   ("reasoning_parser", reasoning_parser, reasoning_parser_names)):
            error = parser_error(engine, name, known() if name else (), field)
            if error is not None:
                raise ValueError(error)
        self.tokenizer = get_cached_tokenizer(tokenizer)
        """The engine's tokenizer with vLLM's cached vocabulary: every parser built looks its tags up in it."""
        self.has_reasoning = bool(reasoning_parser)
        self.has_tools = bool(tool_call_parser)
        self._classes: dict[tuple[bool, bool], Any] = {}
        """(reads reasoning, reads ``auto`` calls) -> the composed ``Parser`` class."""
        for reasoning in (False, True):
            for tools in (False, True):
                if (reasoning and not self.has_reasoning) or (tools and not self.has_tools) or not (reasoning or tools):
                    continue
                self._classes[reasoning, tools] = _compose(engine, tool_call_parser if tools else "",
                                                           reasoning_parser if reasoning else "", self.tokenizer)

    def reader(self, reading: OutputReading, run: Runner) -> RequestReader | None:
        """How one chat request's completions are read (None: they are all content)."""
        auto = reading.calls == "auto" and self.has_tools
        reasoning = self.has_reasoning and not self.prompt_ends_thinking(reading.prompt_ids,
                                                                          reading.chat_template_kwargs)
        forced = reading.calls in ("required", "named")
        if not (auto or reasoning or forced):
            return None
        return RequestReader(self, self._classes.get((reasoning, auto)), reading, reasoning, auto, run)

    def prompt_ends_thinking(self, prompt_ids: list[int], chat_template_kwargs: dict[str, Any]) -> bool:
        """Whether the prompt already ended the thinking (a template that closes it when thinking is off):
        what vLLM's streaming reader and its structured-output gate decide from the prompt."""
        if not self.has_reasoning:
            return True
        parser = self._classes[True, False](self.tokenizer, None, chat_template_kwargs=chat_template_kwargs,
                                            model_config=None)
        return bool(parser.is_reasoning_end(prompt_ids))

    def content_after_thinking(self, text: str, token_ids: list[int], prompt_ids: list[int],
                               chat_template_kwargs: dict[str, Any]) -> str | None:
        """A whole completion's text after its thinking ("" when it is all thinking), as the chat API's
        ``message.content``; None on an engine without a reasoning parser. (The agent reads its roles'
        free text with it.)"""
        if not self.has_reasoning:
            return None
        if self.prompt_ends_thinking(prompt_ids, chat_template_kwargs):
            return text
        parser = self._classes[True, False](self.tokenizer, None, chat_template_kwargs=chat_template_kwargs,
                                            model_config=None)
        parser.set_prompt_token_ids(prompt_ids)
        _, content, _ = parser.parse(text, _vllm_request(None, "none"), model_output_token_ids=token_ids)
        return content or ""


class RequestReader:
    """One chat request's reading (implements ``client.OutputReader``)."""

    def __init__(self, parsers: EngineParsers, parser_cls: Any, reading: OutputReading, reads_reasoning: bool,
                 auto: bool, run: Runner) -> None:
        self._parsers = parsers
        self._parser_cls = parser_cls
        self._reading = reading
        self._auto = auto
        self._run = run
        self._request = _vllm_request(reading.tools if auto else None, "auto" if auto else "none")
        self.reads_reasoning = reads_reasoning
        self.skip_special_tokens = True
        if parser_cls is not None:  # as vLLM's renderer asks the parser (Hermes keeps its tags)
            adjusted = self._new_parser().adjust_request(self._request.model_copy(deep=True))
            self.skip_special_tokens = bool(adjusted.skip_special_tokens)

    def choice(self) -> ChoiceReader:
        forced = None
        if self._reading.calls in ("required", "named"):
            function = self._reading.function if self._reading.calls == "named" else None
            forced = ForcedCalls(function, self._parsers.tokenizer)
        parser = self._new_parser() if self._parser_cls is not None else None
        return _ChoiceReader(parser, self._request, self._reading.prompt_ids, self._auto, forced, self._run)

    def _new_parser(self) -> Any:
        return self._parser_cls(self._parsers.tokenizer, self._request.tools,
                                chat_template_kwargs=dict(self._reading.chat_template_kwargs), model_config=None)


class _ChoiceReader:
    """One completion's reading (implements ``client.ChoiceReader``)."""

    def __init__(self, parser: Any, request: Any, prompt_ids: list[int], auto: bool, forced: ForcedCalls | None,
                 run: Runner) -> None:
        self._parser = parser
        self._request = request
        self._prompt_ids = prompt_ids
        self._auto = auto
        self._forced = forced
        self._run = run

    async def whole(self, text: str, token_ids: list[int]) -> ParsedOutput:
        return await self._run(lambda _: self._read_whole(text, token_ids))

    def _read_whole(self, text: str, token_ids: list[int]) -> ParsedOutput:
        reasoning, content, calls = None, text, None
        if self._parser is not None:
            self._parser.set_prompt_token_ids(self._prompt_ids)
            reasoning, content, calls = self._parser.parse(text, self._request, enable_auto_tools=self._auto,
                                                           model_output_token_ids=token_ids)
        if self._forced is not None:
            return ParsedOutput(reasoning, None, self._forced.whole(content or ""))
        found = [ParsedToolCall(c.name, c.arguments, c.id) for c in calls or []]
        return ParsedOutput(reasoning, content, found or None)

    def delta(self, text: str, token_ids: list[int], *, finished: bool) -> OutputDelta | None:
        reasoning, content, calls = None, text, []
        if self._parser is not None:
            message = self._parser.parse_delta(text, list(token_ids), self._request,
                                               prompt_token_ids=self._prompt_ids, finished=finished)
            if message is None:
                reasoning, content = None, None
            else:
                reasoning, content, calls = message.reasoning, message.content, message.tool_calls or []
        if self._forced is not None:
            calls = self._forced.feed(content or "") if content is not None else []
            content = None
        pieces = [_call_delta(call) for call in calls]
        if reasoning is None and content is None and not pieces:
            return None
        return OutputDelta(reasoning, content, pieces)


class ForcedCalls:
    """The calls of a completion forced to JSON (``tool_choice`` ``required``: a list of ``{"name",
    "parameters"}``; a named function: its arguments), read with vLLM's streaming readers of that JSON."""

    def __init__(self, function: str | None, tokenizer: Any) -> None:
        """``function``: the named function (None: ``required``)."""
        self._function = function
        self._tokenizer = tokenizer
        self._text = ""
        self._name_sent = False

    def feed(self, piece: str) -> list[Any]:
        """vLLM's ``DeltaToolCall``s for the next piece of the JSON: a call's id and name once they are
        known, then its arguments piece by piece."""
        from vllm.tool_parsers.streaming import extract_named_tool_call_streaming, extract_required_tool_call_streaming

        if self._function is not None:
            if self._name_sent and not piece:
                return []
            message, self._name_sent = extract_named_tool_call_streaming(
                delta_text=piece, function_name=self._function, function_name_returned=self._name_sent,
                tool_call_idx=None, tool_call_id_type="random", tokenizer=self._tokenizer)
        else:
            previous = self._text
            self._text += piece
            message, _ = extract_required_tool_call_streaming(previous_text=previous, current_text=self._text,
                                                              tool_call_idx=None, tool_call_id_type="random")
        return message.tool_calls if message is not None else []

    def whole(self, content: str) -> list[ParsedToolCall]:
        """The calls of a finished completion: those a stream of it sends (a call cut by ``max_tokens``
        with its arguments as far as they go); none when not even a function name was complete."""
        if self._function is not None and not content.strip():
            return []
        return [ParsedToolCall(d.name, d.arguments or "", d.id) for d in (_call_delta(c) for c in self.feed(content))
                if d.name is not None]


def _call_delta(call: Any) -> ToolCallDelta:
    function = call.function
    return ToolCallDelta(call.index, call.id, function.name if function else None,
                         function.arguments if function else None)


def _compose(engine: str, tool_call_parser: str, reasoning_parser: str, tokenizer: Any) -> Any:
    """vLLM's composed ``Parser`` class of these two parsers (one may be empty), checked against the
    tokenizer; a parser it refuses is one line naming the engine field."""
    from vllm.parser import ParserManager

    try:
        return ParserManager.get_parser(tool_parser_name=tool_call_parser or None,
                                        reasoning_parser_name=reasoning_parser or None,
                                        enable_auto_tools=bool(tool_call_parser), tokenizer=tokenizer)
    except TypeError as err:
        field, name = ("reasoning_parser", reasoning_parser) if reasoning_parser else ("tool_call_parser",
                                                                                      tool_call_parser)
        raise ValueError(f"engines.{engine}.{field}: {name!r} cannot read this model's output: "
                         f"{err.__cause__ or err}") from None


def _vllm_request(tools: list[dict[str, Any]] | None, tool_choice: str) -> Any:
    """The vLLM request a parser reads: the tools and ``tool_choice`` (parsers read no messages)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[], tools=tools, tool_choice=tool_choice)
