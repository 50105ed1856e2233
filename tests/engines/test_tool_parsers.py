"""``engines.<name>.tool_call_parser``: vLLM's real tool-call parsers (Hermes on the tiny model's own tokenizer)
read ``tool_choice: "auto"`` completions into the API's ``tool_calls``, whole or streamed; forced calls are read
from their JSON piece by piece; a parser name vLLM does not register is one line naming the field, before any
engine starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mia_engine.config import ConfigError, load_config
from mia_engine.deploy.engines import check_engine_parsers
from mia_engine.engines.client import OutputReading
from mia_engine.engines.output_parsers import EngineParsers, RequestReader
from mia_engine.engines.tool_parsers import check_parser_names
from mia_engine.server.openai_bodies import ToolCall
from mia_engine.server.tool_calls import parsed_tool_calls

from tests.engines.conftest import CALL, WEATHER
from tests.processes import refused_serve



@pytest.fixture(scope="module")
def hermes(tokenizer) -> EngineParsers:
    return EngineParsers("tiny", "hermes", "", tokenizer)


async def _run(work):
    return work(None)


def _reader(parsers: EngineParsers, calls: str = "auto", function: str = "") -> RequestReader:
    reader = parsers.reader(OutputReading([1, 2, 3], {}, [WEATHER], calls, function), _run)  # type: ignore[arg-type]
    assert reader is not None
    return reader


async def _calls(parsers: EngineParsers, text: str, parallel: bool | None = None
                 ) -> tuple[str | None, list[ToolCall] | None]:
    found = await _reader(parsers).choice().whole(text, [])
    return found.content, parsed_tool_calls(found.calls, parallel)


def _streamed(reader: RequestReader, tokenizer, text: str) -> list:
    """``text`` fed token by token to one choice's reader: the pieces it sends."""
    choice, ids = reader.choice(), tokenizer.encode(text, add_special_tokens=False)
    pieces = [choice.delta(tokenizer.decode([i]), [i], finished=n == len(ids) - 1) for n, i in enumerate(ids)]
    return [p for p in pieces if p is not None]


async def test_hermes_reads_a_call_the_tiny_tokenizer_decodes(hermes: EngineParsers, tokenizer) -> None:
    """The call survives the tiny model's detokenizer (its tags are tokens of its vocabulary) and becomes
    the API's ``ToolCall``."""
    assert _reader(hermes).skip_special_tokens is False  # Hermes keeps its tags, as in vllm serve
    text = tokenizer.decode(tokenizer.encode(CALL, add_special_tokens=False), skip_special_tokens=False)
    content, calls = await _calls(hermes, text)
    assert content is None
    (call,) = calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


async def test_text_before_the_calls_is_content_and_several_calls_are_read(hermes: EngineParsers) -> None:
    second = CALL.replace("Paris", "Rome")
    content, calls = await _calls(hermes, f"Let me look.\n{CALL}\n{second}")
    assert content == "Let me look.\n"
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert len({c.id for c in calls}) == 2
    _, (first,) = await _calls(hermes, f"{CALL}{second}", parallel=False)  # as vLLM: the first call only
    assert json.loads(first.function.arguments)["city"] == "Paris"


@pytest.mark.parametrize("text", ["The weather is fine.", "", "<tool_call>not json</tool_call>"])
async def test_text_without_a_call_is_plain_content(hermes: EngineParsers, text: str) -> None:
    assert await _calls(hermes, text) == (text, None)


def test_a_streamed_call_comes_in_pieces_its_id_and_name_first(hermes: EngineParsers, tokenizer) -> None:
    """As vLLM's serving streams it: the text before the call as content, the call's tags held back, then
    one piece with the call's id and name and pieces of its arguments that join into the whole JSON."""
    pieces = _streamed(_reader(hermes), tokenizer, f"Let me look.{CALL}")
    assert "".join(p.content or "" for p in pieces) == "Let me look."
    calls = [c for p in pieces for c in p.tool_calls]
    assert calls[0].id and calls[0].name == "get_weather" and all(c.name is None for c in calls[1:])
    assert len(calls) > 2 and json.loads("".join(c.arguments or "" for c in calls)) == {"city": "Paris"}


@pytest.mark.parametrize("calls, function, text", [
    ("required", "", '[{"name": "get_weather", "parameters": {"city": "Lima"}}]'),
    ("named", "get_weather", '{"city": "Lima"}'),
])
async def test_forced_calls_stream_their_arguments_and_a_cut_call_keeps_what_was_written(
        hermes: EngineParsers, tokenizer, calls: str, function: str, text: str) -> None:
    """A forced call (JSON under a grammar) streams its id and name, then its arguments as they come; a
    completion cut short (``max_tokens``) reads whole as the stream sent it: the call, arguments cut."""
    reader = _reader(hermes, calls, function)
    streamed = [c for p in _streamed(reader, tokenizer, text) for c in p.tool_calls]
    assert streamed[0].id and streamed[0].name == "get_weather" and len(streamed) > 2
    assert json.loads("".join(c.arguments or "" for c in streamed)) == {"city": "Lima"}
    (whole,) = (await reader.choice().whole(text, [])).calls
    assert (whole.name, json.loads(whole.arguments)) == ("get_weather", {"city": "Lima"})
    cut = text[:text.index("Lima") + 2]
    (partial,) = (await reader.choice().whole(cut, [])).calls
    assert partial.name == "get_weather" and partial.arguments == '{"city": "Li'
    assert (await _reader(hermes, "required").choice().whole('[{"na', [])).calls == []  # no name yet: no call


def _tiny_with_parser(name: str):
    return load_config("tiny", {"engines.tiny.tool_call_parser": name})


def test_a_misspelt_parser_is_one_line_naming_the_field(tokenizer) -> None:
    expected = "engines.tiny.tool_call_parser: 'hermess' is not a tool-call parser of vLLM (did you mean hermes?)"
    with pytest.raises(ValueError) as err:
        check_parser_names(_tiny_with_parser("hermess"))
    assert str(err.value) == expected
    with pytest.raises(ConfigError) as preflight:
        check_engine_parsers(_tiny_with_parser("hermess"))
    assert str(preflight.value) == expected
    with pytest.raises(ValueError, match=r"^engines\.tiny\.tool_call_parser: 'hermess' "):
        EngineParsers("tiny", "hermess", "", tokenizer)


def test_serve_refuses_a_misspelt_parser_before_anything_starts(tmp_path: Path) -> None:
    done = refused_serve(tmp_path, "--engines.tiny.tool_call_parser=hermess")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m mia_engine: error: engines.tiny.tool_call_parser: 'hermess' is not a tool-call parser of vLLM "
        "(did you mean hermes?)")
    assert not (tmp_path / "data").exists()


def test_the_bundled_parsers_are_vllms() -> None:
    for name in ("tiny", "8xgpu", "8xgpu_cpu"):
        config = load_config(name)
        assert {e.tool_call_parser for e in config.engines.values()} == {"hermes"}, name
        check_parser_names(config)
