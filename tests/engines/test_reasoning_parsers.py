"""``engines.<name>.reasoning_parser``: vLLM's real reasoning parsers on the tiny model's tokenizer (its vocabulary
has ``<think>`` and ``</think>``) split the thinking off, whole or streamed, and the content after it is what
the tool-call parser and the agent read; a name vLLM does not register is one line naming the field, before
any engine starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mia_engine.agent.llm import Completion, complete_ids
from mia_engine.config import ConfigError, load_config
from mia_engine.deploy.engines import check_engine_parsers
from mia_engine.engines.client import CompletionDelta, OutputReading
from mia_engine.engines.output_parsers import EngineParsers
from mia_engine.engines.tool_parsers import check_parser_names
from tests.fakes import RolesByName
from tests.engines.conftest import CALL, WEATHER
from tests.processes import refused_serve

THOUGHT = "<think>Paris is in France.</think>"


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


async def _run(work):
    return work(None)


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
async def test_the_thinking_is_split_off_whole_and_streamed(tokenizer, prompt: list[int], name: str) -> None:
    parsers = EngineParsers("tiny", "", name, tokenizer)
    reader = parsers.reader(OutputReading(prompt), _run)
    assert reader is not None and reader.reads_reasoning
    text = f"{THOUGHT}It is sunny."
    whole = await reader.choice().whole(text, tokenizer.encode(text, add_special_tokens=False))
    assert (whole.reasoning, whole.content, whole.calls) == ("Paris is in France.", "It is sunny.", None)
    choice, ids = reader.choice(), tokenizer.encode(text, add_special_tokens=False)
    pieces = [choice.delta(tokenizer.decode([i]), [i], finished=n == len(ids) - 1) for n, i in enumerate(ids)]
    pieces = [p for p in pieces if p is not None]
    assert "".join(p.reasoning or "" for p in pieces) == "Paris is in France."
    assert "".join(p.content or "" for p in pieces) == "It is sunny."
    first_content = next(n for n, p in enumerate(pieces) if p.content)
    assert all(p.content is None for p in pieces[:first_content]) and all(p.reasoning is None
                                                                          for p in pieces[first_content:])


async def test_the_tool_call_parser_reads_the_content_after_the_thinking(tokenizer, prompt: list[int]) -> None:
    parsers = EngineParsers("tiny", "hermes", "deepseek_r1", tokenizer)
    reader = parsers.reader(OutputReading(prompt, {}, [WEATHER], "auto"), _run)
    assert reader is not None
    found = await reader.choice().whole(f"{THOUGHT}{CALL}", [])
    assert found.reasoning == "Paris is in France." and found.content is None
    (call,) = found.calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    forced = parsers.reader(OutputReading(prompt, {}, [WEATHER], "named", "get_weather"), _run)
    assert forced is not None
    named = await forced.choice().whole('<think>Rome?</think>{"city": "Rome"}', [])
    assert named.reasoning == "Rome?" and [(c.name, c.arguments) for c in named.calls] == [
        ("get_weather", '{"city": "Rome"}')]


async def test_a_prompt_that_ended_the_thinking_leaves_all_content(tokenizer, prompt: list[int]) -> None:
    """A template that closes the thinking in the prompt (thinking off): nothing of the completion is
    thinking, as vLLM decides from the prompt; Qwen3's parser also reads ``enable_thinking``."""
    closed = prompt + tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    parsers = EngineParsers("tiny", "", "deepseek_r1", tokenizer)
    assert parsers.reader(OutputReading(closed), _run) is None
    assert parsers.content_after_thinking("plain answer", [], closed, {}) == "plain answer"
    assert parsers.content_after_thinking(f"{THOUGHT} answer", [], prompt, {}) == " answer"
    assert parsers.content_after_thinking("<think>cut short", [], prompt, {}) == ""
    qwen3 = EngineParsers("tiny", "", "qwen3", tokenizer)
    assert qwen3.reader(OutputReading(prompt, {"enable_thinking": False}), _run) is None
    assert EngineParsers("tiny", "", "", tokenizer).content_after_thinking("x", [], prompt, {}) is None


class _Thinker(RolesByName):
    """A role whose engine split the thinking off (``CompletionDelta.content``) when the agent asked for it."""

    def max_tokens_for(self, model: str, prompt_len: int, requested: int | None) -> int:
        return 16

    async def generate(self, model: str, prompt_ids: list[int], options, request_id: str, *, stream: bool):
        content = "Paris." if options.split_thinking else None
        yield [CompletionDelta(0, f"{THOUGHT}Paris.", 3, token_ids=[1, 2, 3], content=content)]


async def test_the_agent_reads_free_text_after_the_thinking_and_constrained_text_whole() -> None:
    from mia_engine.agent.llm import sampling_options
    from mia_engine.config.agent import RoleSampling

    role = _Thinker().role("manager")
    free = sampling_options(RoleSampling(max_tokens=16))
    assert free.split_thinking and free.reasoning_ended
    (completion,) = await complete_ids(role, [1], free)
    assert completion.after_thinking == "Paris." and completion.text == f"{THOUGHT}Paris."
    constrained = sampling_options(RoleSampling(max_tokens=16), regex="[a-z]+")
    assert not constrained.split_thinking and constrained.reasoning_ended  # the loop's regexes spell out thinking
    (completion,) = await complete_ids(role, [1], constrained)
    assert completion.after_thinking == completion.text  # strip_think reads it, as on an engine without a parser
    assert Completion("<think>a</think>b", []).after_thinking == "<think>a</think>b"


def test_a_misspelt_reasoning_parser_is_one_line_naming_the_field(tokenizer) -> None:
    config = load_config("tiny", {"engines.tiny.reasoning_parser": "deepseek_r2"})
    expected = ("engines.tiny.reasoning_parser: 'deepseek_r2' is not a reasoning parser of vLLM "
                "(did you mean deepseek_r1?)")
    with pytest.raises(ValueError) as err:
        check_parser_names(config)
    assert str(err.value) == expected
    with pytest.raises(ConfigError) as preflight:
        check_engine_parsers(config)
    assert str(preflight.value) == expected
    with pytest.raises(ValueError, match=r"^engines\.tiny\.reasoning_parser: 'mistral' cannot read this model's "):
        EngineParsers("tiny", "", "mistral", tokenizer)  # its tags are not in the tiny vocabulary


def test_serve_refuses_a_misspelt_reasoning_parser_before_anything_starts(tmp_path: Path) -> None:
    done = refused_serve(tmp_path, "--engines.tiny.reasoning_parser=deepseek_r2")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m mia_engine: error: engines.tiny.reasoning_parser: 'deepseek_r2' is not a reasoning parser of "
        "vLLM (did you mean deepseek_r1?)")
    assert not (tmp_path / "data").exists()
