"""``engines.<name>.tool_call_parser``: vLLM's real tool-call parsers (Hermes on the tiny model's own tokenizer)
read ``tool_choice: "auto"`` completions into the API's ``tool_calls``; a name vLLM does not register is one
line naming the field, before any engine starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mia_engine.config import ConfigError, load_config
from mia_engine.deploy.engines import check_engine_parsers
from mia_engine.engines.tool_parsers import ToolCallParser, check_tool_call_parsers
from mia_engine.models.tiny import build_tiny
from mia_engine.server.openai_bodies import ToolCall
from mia_engine.server.tool_calls import parsed_tool_calls

from tests.processes import refused_serve

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out)
    return AutoTokenizer.from_pretrained(Path(out) / "base")


@pytest.fixture(scope="module")
def hermes(tokenizer) -> ToolCallParser:
    return ToolCallParser("tiny", "hermes", tokenizer)


def _calls(parser: ToolCallParser, text: str, parallel: bool | None = None) -> tuple[str | None, list[ToolCall] | None]:
    found = parser.extract(text, [WEATHER])
    return found.content, parsed_tool_calls(found, parallel)


def test_hermes_reads_a_call_the_tiny_tokenizer_decodes(hermes: ToolCallParser, tokenizer) -> None:
    """The call survives the tiny model's detokenizer (its tags are tokens of its vocabulary) and becomes
    the API's ``ToolCall``."""
    assert hermes.skips_special_tokens([WEATHER]) is False  # Hermes keeps its tags, as in vllm serve
    text = tokenizer.decode(tokenizer.encode(CALL, add_special_tokens=False), skip_special_tokens=False)
    content, calls = _calls(hermes, text)
    assert content is None
    (call,) = calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_text_before_the_calls_is_content_and_several_calls_are_read(hermes: ToolCallParser) -> None:
    second = CALL.replace("Paris", "Rome")
    content, calls = _calls(hermes, f"Let me look.\n{CALL}\n{second}")
    assert content == "Let me look.\n"
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert len({c.id for c in calls}) == 2
    _, (first,) = _calls(hermes, f"{CALL}{second}", parallel=False)  # as vLLM: the first call only
    assert json.loads(first.function.arguments)["city"] == "Paris"


@pytest.mark.parametrize("text", ["The weather is fine.", "", "<tool_call>not json</tool_call>"])
def test_text_without_a_call_is_plain_content(hermes: ToolCallParser, text: str) -> None:
    assert _calls(hermes, text) == (text, None)


def _tiny_with_parser(name: str):
    return load_config("tiny", {"engines.tiny.tool_call_parser": name})


def test_a_misspelt_parser_is_one_line_naming_the_field(tokenizer) -> None:
    expected = "engines.tiny.tool_call_parser: 'hermess' is not a tool-call parser of vLLM (did you mean hermes?)"
    with pytest.raises(ValueError) as err:
        check_tool_call_parsers(_tiny_with_parser("hermess"))
    assert str(err.value) == expected
    with pytest.raises(ConfigError) as preflight:
        check_engine_parsers(_tiny_with_parser("hermess"))
    assert str(preflight.value) == expected
    with pytest.raises(ValueError, match=r"^engines\.tiny\.tool_call_parser: 'hermess' "):
        ToolCallParser("tiny", "hermess", tokenizer)


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
        check_tool_call_parsers(config)
