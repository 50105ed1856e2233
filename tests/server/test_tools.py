"""``tools`` / ``tool_choice`` on the raw roles: ``required`` and a named function through structured outputs,
``auto`` through the engine's tool-call parser (Hermes on the tiny engine), streamed call by call as they are
generated (id and name, then argument pieces), everything else a 400 naming the field, never dropped."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from openai import OpenAI

from mia_engine.config import ServerConfig
from mia_engine.server.chat import ChatService
from mia_engine.server.errors import BadRequest
from mia_engine.server.metrics import Metrics
from mia_engine.server.openai_bodies import ChatCompletionRequest
from tests.fakes import RolesByName
from tests.conftest import ServerHandle

CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
CITIES = ["Paris", "Rome", "Lima"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}},
                                       "required": ["utc"], "additionalProperties": False}}}


def _check_call(call, tools: dict[str, dict]) -> None:
    assert call.type == "function" and call.id
    assert call.function.name in tools
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert arguments["city"] in CITIES
    else:
        assert isinstance(arguments["utc"], bool)


def test_required_gives_tool_calls_matching_the_schema(openai_client: OpenAI) -> None:
    out = openai_client.chat.completions.create(model="executor", messages=CHAT, tools=[WEATHER, TIME],
                                                tool_choice="required", parallel_tool_calls=False, max_tokens=200,
                                                temperature=0)  # one call: the random model would list calls on
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1
    for call in choice.message.tool_calls:
        _check_call(call, {"get_weather": WEATHER, "get_time": TIME})


def test_named_function_is_called(openai_client: OpenAI) -> None:
    out = openai_client.chat.completions.create(
        model="planner", messages=CHAT, tools=[WEATHER, TIME], max_tokens=200, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    _check_call(call, {"get_weather": WEATHER})
    assert out.choices[0].finish_reason == "stop"


def _streamed_call(chunks: list) -> tuple[str, str, int]:
    """A stream's one call: (its name, its arguments joined, the chunks that carried it). The first piece
    carries the id, type and name, the later ones argument text only (OpenAI's stream format)."""
    pieces = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert pieces and pieces[0].id and pieces[0].type == "function" and pieces[0].function.name
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in pieces[1:])
    return pieces[0].function.name, "".join(p.function.arguments or "" for p in pieces), len(pieces)


def test_required_streams_its_call_as_it_is_generated(openai_client: OpenAI) -> None:
    kwargs = dict(model="executor", messages=CHAT, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                  max_tokens=200, temperature=0)
    chunks = list(openai_client.chat.completions.create(**kwargs, stream=True, logprobs=True))
    name, arguments, num_pieces = _streamed_call(chunks)
    assert num_pieces > 1  # the arguments in pieces, not the whole call at the end
    assert name == "get_weather" and json.loads(arguments)["city"] in CITIES
    assert sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices and c.choices[0].logprobs) > 5
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    (whole,) = openai_client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    assert whole.function.arguments == arguments  # the same call, whole


def test_a_named_function_streams_its_arguments(openai_client: OpenAI) -> None:
    chunks = list(openai_client.chat.completions.create(
        model="planner", messages=CHAT, tools=[WEATHER, TIME], max_tokens=200, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    name, arguments, num_pieces = _streamed_call(chunks)
    assert name == "get_time" and num_pieces > 1 and isinstance(json.loads(arguments)["utc"], bool)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_max_tokens_ends_with_length_and_what_was_written(openai_client: OpenAI,
                                                                                stream: bool) -> None:
    """No 4xx can follow a started stream; a whole answer says what the stream would have: the call, its
    arguments as far as they were generated, and ``finish_reason`` ``length``."""
    kwargs = dict(model="planner", messages=CHAT, tools=[WEATHER], max_tokens=3, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    if stream:
        chunks = list(openai_client.chat.completions.create(**kwargs, stream=True))
        name, arguments, _ = _streamed_call(chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        choice = openai_client.chat.completions.create(**kwargs).choices[0]
        ((name, arguments),) = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        reason = choice.finish_reason
    assert reason == "length" and name == "get_weather" and arguments.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)  # cut


def test_a_tool_result_continues_the_conversation(openai_client: OpenAI) -> None:
    """A conversation with an assistant's call and the tool's answer is accepted (the tiny model's template
    renders neither tools nor calls, so their effect on the prompt is checked in the next test)."""
    call = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call-1", "content": "sunny, 21 C"}]
    out = openai_client.chat.completions.create(model="planner", messages=messages, tools=[WEATHER],
                                                tool_choice="none", max_tokens=4, temperature=0)
    assert out.choices[0].message.tool_calls is None and isinstance(out.choices[0].message.content, str)


def test_calls_and_call_ids_are_handed_to_the_template() -> None:
    from mia_engine.server.chat_messages import flatten_message, with_tool_fields
    from mia_engine.server.openai_bodies import ChatMessage, FunctionCall, ToolCall

    call = ToolCall("call-1", FunctionCall("get_weather", '{"city": "Paris"}'))
    assistant = ChatMessage("assistant", None, tool_calls=[call])
    rendered = with_tool_fields(assistant, flatten_message(0, assistant))
    assert rendered == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call-1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}, "type": "function"}]}
    answer = ChatMessage("tool", "sunny", tool_call_id="call-1")
    assert with_tool_fields(answer, flatten_message(1, answer))["tool_call_id"] == "call-1"


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"functions": [WEATHER["function"]]}, "functions"),
    ({"model": "mia", "tools": [WEATHER], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "big", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "enum": [f"v{i}" for i in range(4000)]}}}}}],
      "tool_choice": "required"}, "tools"),  # over limits.max_json_schema_bytes
])
def test_unsupported_tool_use_is_a_400_naming_the_field(tiny_server: ServerHandle, body: dict, param: str) -> None:
    response = httpx.post(f"{tiny_server.openai_url}/chat/completions", timeout=60,
                          headers={"Authorization": f"Bearer {tiny_server.api_key}"},
                          json={"model": "planner", "messages": CHAT, "max_tokens": 8, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# ---- tool_choice auto: the engine's tool-call parser ------------------------------------------------------

FORCED_CALL = {"regex": r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}</tool_call>'}
"""Makes the random tiny model write a Hermes call, so the parser has one to read."""


def test_auto_is_the_default_and_answers_text_the_parser_finds_no_call_in(openai_client: OpenAI) -> None:
    out = openai_client.chat.completions.create(model="manager", messages=CHAT, tools=[WEATHER], max_tokens=8,
                                                temperature=0)
    choice = out.choices[0]
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")


def test_auto_reads_the_models_own_call_into_tool_calls(openai_client: OpenAI) -> None:
    out = openai_client.chat.completions.create(model="manager", messages=CHAT, tools=[WEATHER, TIME],
                                                tool_choice="auto", max_tokens=128, temperature=0,
                                                extra_body={"structured_outputs": FORCED_CALL})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    _check_call(call, {"get_weather": WEATHER})
    assert choice.message.content is None


def test_auto_streams_the_parsed_call_in_pieces(openai_client: OpenAI) -> None:
    """Through the parser's ``extract_tool_calls_streaming``, as vLLM's serving streams it: the call's tags are
    held back, then its id and name, then its arguments piece by piece."""
    chunks = list(openai_client.chat.completions.create(
        model="manager", messages=CHAT, tools=[WEATHER], max_tokens=128, temperature=0, stream=True,
        extra_body={"structured_outputs": FORCED_CALL}))
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # the tags are not content
    name, arguments, num_pieces = _streamed_call(chunks)
    assert name == "get_weather" and json.loads(arguments)["city"] in CITIES and num_pieces > 1
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


class _NoParser(RolesByName):
    """An engine client whose engines have no tool-call parser (only what ``prepare`` asks before it refuses)."""

    def has_model(self, model: str) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def parses_tool_calls(self, model: str) -> bool:
        return False


@pytest.mark.parametrize("choice", [None, "auto"])
async def test_auto_on_an_engine_without_a_parser_is_a_400_naming_tool_choice(choice: str | None) -> None:
    chat = ChatService(_NoParser(), ServerConfig(), Metrics())  # type: ignore[arg-type]
    request = msgspec.convert({"model": "manager", "messages": CHAT, "tools": [WEATHER], "tool_choice": choice},
                              ChatCompletionRequest)
    with pytest.raises(BadRequest) as err:
        await chat.prepare(request)
    assert err.value.param == "tool_choice" and "tool_call_parser" in err.value.message
