"""Every per-request limit refuses with an OpenAI-style 4xx that names the field, before any work."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from bench.grammar_compile import FAMILIES, largest_accepted
from mia_engine.config import LimitsConfig, load_config
from mia_engine.models.tiny import VOCAB_SIZE, build_tiny
from mia_engine.server.errors import BadRequest
from mia_engine.server.grammar_cost import schema_cost
from mia_engine.server.limits import check_chat_limits
from mia_engine.server.openai_bodies import ChatCompletionRequest

LIMITS = LimitsConfig()
DEFAULT_VOCAB = 49152
"""The default model's vocabulary (SmolLM2), in tokens."""
PROMPT = [{"role": "user", "content": "hello"}]
GROUP = {"messages": PROMPT, "completions": [{"text": "a", "reward": 1.0}, {"text": "b", "reward": 0.0}]}


def _post(server, path: str, body: dict, *, key: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.openai_url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key or server.api_key}"})


def _assert_refused(response: httpx.Response, status: int, param: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error


@pytest.mark.parametrize("extra, param", [
    ({"n": 17}, "n"),
    ({"stop": ["x"] * (LIMITS.max_stop_sequences + 1)}, "stop"),
    ({"stop": "x" * (LIMITS.max_stop_chars + 1)}, "stop"),
    ({"structured_outputs": {"regex": "a" * (LIMITS.max_regex_chars + 1)}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["c"] * (LIMITS.max_choices + 1)}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["c" * (LIMITS.max_choice_chars + 1)]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": {"enum": ["v" * LIMITS.max_json_schema_bytes]}}}, "structured_outputs.json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "enum": ["v" * LIMITS.max_json_schema_bytes]}}}}, "response_format.json_schema.schema"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {f"k{i}": i for i in range(17)}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"persona": "x" * 1025}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"persona": {"nested": 1}}}, "chat_template_kwargs[...]"),
    ({"chat_template": "{{ messages }}"}, "chat_template"),
])
def test_chat_limits(tiny_server, extra: dict, param: str) -> None:
    _assert_refused(_post(tiny_server, "/chat/completions", {"model": "planner", "messages": PROMPT, **extra}),
                    400, param)


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_a_server_wide_max_tokens_is_an_explicit_setting(param: str) -> None:
    """None by default (0), as ``vllm serve`` has none: a budget is bounded by the context only."""
    request = msgspec.convert({"model": "planner", "messages": PROMPT, param: 100_000}, ChatCompletionRequest)
    assert LIMITS.max_tokens == 0
    check_chat_limits(request, LIMITS)
    with pytest.raises(BadRequest) as refused:
        check_chat_limits(request, LimitsConfig(max_tokens=4096))
    assert refused.value.param == param and refused.value.code == "limit_exceeded"


@pytest.mark.parametrize("path, body, param", [
    ("/chat/completions", {"messages": PROMPT}, "messages"),
    ("/completions", {"prompt": "hello"}, "prompt"),
])
def test_max_tokens_past_the_context_is_a_400_naming_the_prompt(tiny_server, path: str, body: dict,
                                                                 param: str) -> None:
    """Past the old server-wide 4096 and past what the tiny model's context (4096) leaves: refused as vLLM
    refuses it, by the context."""
    response = _post(tiny_server, path, {"model": "planner", "max_tokens": 5000, **body})
    _assert_refused(response, 400, param)
    assert response.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("extra, param", [
    ({"rollouts": LIMITS.max_rollouts + 1}, "rollouts"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),  # the agent renders its own
    ({"ground_truth": ["x" * (LIMITS.max_ground_truth_chars + 1)]}, "ground_truth"),
    ({"messages": [{"role": "user", "content": "why " * LIMITS.max_question_chars}]}, "messages[0].content"),
])
def test_research_limits_answer_before_the_work(tiny_server, extra: dict, param: str) -> None:
    response = _post(tiny_server, "/chat/completions", {"model": "mia", "messages": PROMPT, **extra})
    _assert_refused(response, 400, param)
    assert response.elapsed.total_seconds() < 5  # refused up front, not after a research loop


@pytest.mark.parametrize("extra, param", [
    ({"messages": [{"role": "user", "content": "ж" * 3000}]}, "messages"),  # byte-level BPE: 2+ tokens a char
    ({"ground_truth": ["ж" * 1000, "ж" * 2000]}, "ground_truth"),
])
def test_research_input_that_cannot_fit_the_context_is_400_up_front(tiny_server, extra: dict, param: str) -> None:
    """Under the character caps, over a quarter of the tiny model's 4096-token context."""
    response = _post(tiny_server, "/chat/completions", {"model": "mia", "messages": PROMPT, **extra})
    _assert_refused(response, 400, param)
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert response.elapsed.total_seconds() < 5


def test_oversized_body_is_413(tiny_server) -> None:
    huge = {"model": "planner", "messages": [{"role": "user", "content": "x" * (9 << 20)}]}
    response = _post(tiny_server, "/chat/completions", huge)
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize("body, param", [
    ({"groups": [GROUP] * (LIMITS.max_grpo_groups + 1)}, "groups"),
    ({"groups": [{**GROUP, "completions": GROUP["completions"] * 9}]}, "groups[0].completions"),
    ({"groups": [{**GROUP, "completions": [{"text": "w" * (17 * LIMITS.max_grpo_tokens // 2), "reward": 1.0},
                                           {"text": "w" * (17 * LIMITS.max_grpo_tokens // 2), "reward": 0.0}]}]},
     "groups"),
    ({"groups": [{**GROUP, "completions": [{"text": "why " * 150000, "reward": 1.0},
                                           {"text": "b", "reward": 0.0}]}]}, "groups"),
    ({"groups": [{**GROUP, "messages": [{"role": "user", "content": "x", "name": "y"}]}]},
     "groups[0].messages[0]"),
])
def test_grpo_limits(tiny_server, body: dict, param: str) -> None:
    response = _post(tiny_server, "/adapters/planner/grpo", body, key=tiny_server.admin_key)
    if response.status_code == 413:  # the largest bodies already pass the byte cap
        return
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"].startswith(param), response.text


@pytest.mark.parametrize("name", ["\x00", "a\x00b", "", "x" * 5000])
def test_publish_paths_the_os_refuses_are_400(tiny_server, name: str) -> None:
    """Found by tests/server/test_fuzz.py: a NUL byte in ``path`` was a 500 (under the data dir's adapters
    folder, where publishing may load from)."""
    path = f"{tiny_server.data_dir}/adapters/{name}" if name else name
    _assert_refused(_post(tiny_server, "/adapters/planner", {"path": path}, key=tiny_server.admin_key), 400, "path")


def _widest_accepted() -> list[tuple[str, object]]:
    """Each wide-schema family (``bench/grammar_compile.py``) at the largest size this server accepts for a
    vocabulary of the tiny model's size, and the nested regex repeats that held the compiler for seconds."""
    cases = []
    for name, family in FAMILIES.items():
        k = largest_accepted(family, LIMITS, VOCAB_SIZE)
        if k is not None:
            cases.append((f"{name}, k = {k}", family(k)))
    return cases + [(pattern, {"type": "string", "pattern": pattern}) for pattern in NESTED_REPEATS]


NESTED_REPEATS = ["(.{0,10}){10}", "(.?){30}", "((.{0,7}){7}){7}", "([^x]{0,12}){12}"]
"""Variable-length groups under counted repeats, accepted while the estimate priced them as their expansion
(their compile grows with its square: bench/RESULTS.md, "Admission under load")."""


@pytest.fixture(scope="module")
def grammar_compiler(tmp_path_factory: pytest.TempPathFactory):
    """xgrammar's compiler over the tiny model's tokenizer, set up as vLLM's xgrammar backend sets it up."""
    xgr = pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer
    folder: Path = tmp_path_factory.mktemp("tiny_model")
    build_tiny(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder / "base")
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    return xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)


WIDEST_ACCEPTED = _widest_accepted()


@pytest.mark.parametrize("name, schema", WIDEST_ACCEPTED, ids=[name for name, _ in WIDEST_ACCEPTED])
def test_a_wide_schema_is_refused_or_compiles_within_a_second(grammar_compiler, name: str, schema: dict) -> None:
    """No accepted schema holds the grammar compiler for a second (the engine's validation and its compile,
    as the tiny config runs them: xgrammar, compact JSON)."""
    import xgrammar as xgr
    request = msgspec.convert({"model": "planner", "messages": PROMPT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}, ChatCompletionRequest)
    try:
        check_chat_limits(request, LIMITS)
    except BadRequest as err:
        assert err.param == "response_format.json_schema.schema" and err.code == "limit_exceeded", err
        return
    start = time.perf_counter()
    xgr.Grammar.from_json_schema(json.dumps(schema))  # vLLM's validation when the request is added
    grammar_compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "string", "pattern": "a{10000}"}}}}, "response_format.json_schema.schema"),
    ({"structured_outputs": {"json": {"type": "object", "properties": {str(i): {} for i in range(1400)}}}},
     "structured_outputs.json"),
    ({"structured_outputs": {"regex": "[^x]{0,4000}[^y]{0,4000}"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "(.{0,10}){10}"}}, "structured_outputs.regex"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 10000}}}}} for i in range(4)],
      "tool_choice": "required"}, "tools"),
])
def test_an_expensive_grammar_is_refused_before_the_engine(tiny_server, extra: dict, param: str) -> None:
    response = _post(tiny_server, "/chat/completions", {"model": "planner", "messages": PROMPT, "max_tokens": 4,
                                                        **extra})
    _assert_refused(response, 400, param)
    assert response.elapsed.total_seconds() < 1


def _schema_request(schema: dict) -> ChatCompletionRequest:
    return msgspec.convert({"model": "planner", "messages": PROMPT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}, ChatCompletionRequest)


def test_a_larger_vocabulary_lowers_what_a_grammar_may_cost() -> None:
    """The token-mask cache checks every token: a schema accepted for a model of up to 32k tokens is refused
    for a Qwen3-sized vocabulary, and the refusal names the vocabulary; a small or unknown one (0) keeps
    the budget."""
    request = _schema_request({"type": "string", "pattern": "[a-z]{200}"})  # estimated 200
    for vocab_size in (0, 2048, 32768):
        check_chat_limits(request, LIMITS, vocab_size)
    with pytest.raises(BadRequest) as refused:
        check_chat_limits(request, LIMITS, 151936)
    assert refused.value.param == "response_format.json_schema.schema"
    assert "151936-token vocabulary" in str(refused.value), refused.value


def test_each_distinct_string_length_bound_costs_a_compile_of_its_own() -> None:
    """xgrammar compiles one rule per distinct pair of length bounds, shared by every string with that pair,
    each for about a second on the default model's vocabulary once ``maxLength`` passes ~200 characters:
    16 strings of distinct bounds were accepted there and compiled for 20 s, priced by their characters."""
    def strings(bounds: list[int]) -> dict:
        return {"type": "object", "required": [f"p{i}" for i in range(len(bounds))],
                "properties": {f"p{i}": {"type": "string", "maxLength": b} for i, b in enumerate(bounds)}}

    one = schema_cost(strings([1000]))
    assert schema_cost(strings([1000] * 16)) < 1.1 * one
    assert schema_cost(strings(list(range(1000, 1016)))) > 15 * one
    assert schema_cost(strings([100_000])) == pytest.approx(one)  # flat past a couple of hundred characters
    for schema in (strings([1000]), strings([200, 300])):
        with pytest.raises(BadRequest):
            check_chat_limits(_schema_request(schema), LIMITS, DEFAULT_VOCAB)
    check_chat_limits(_schema_request(strings([36] * 8)), LIMITS, DEFAULT_VOCAB)  # about 0.2 s there


@pytest.mark.parametrize("fixture, vocab_size", [("qwen3-8b", 151936), ("qwen2_5-vl-7b", 152064)])
def test_an_engine_knows_its_vocabulary_from_its_model_folder(fixture: str, vocab_size: int) -> None:
    """The 8-GPU config's models (their config.json): what the grammar budget is scaled by."""
    from mia_engine.engines.vllm_engine import VLLMEngine
    config = load_config("tiny").engines["tiny"]
    engine = VLLMEngine("model", config, Path(__file__).parents[1] / "deploy" / "fixtures" / fixture)
    assert engine.vocab_size == vocab_size
    assert engine.supports_images == (fixture == "qwen2_5-vl-7b")
