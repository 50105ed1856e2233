"""The OpenAI-compatible endpoint, driven by the official ``openai`` client against the real server."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from openai import OpenAI

ROLES = ["planner", "executor", "manager", "judge", "router"]
PROMPT = [{"role": "user", "content": "Which river is the longest in the world?"}]


def test_models_list_has_every_role_and_the_base(openai_client: OpenAI) -> None:
    models = {m.id: m for m in openai_client.models.list().data}
    assert set(ROLES) | {"tiny", "mia"} <= set(models)
    assert models["mia"].owned_by == "agent"
    assert models["planner"].owned_by == "role"
    assert models["tiny"].owned_by == "engine"


@pytest.mark.parametrize("role", ROLES + ["tiny"])
def test_completion_per_role(openai_client: OpenAI, role: str) -> None:
    out = openai_client.chat.completions.create(model=role, messages=PROMPT, max_tokens=12, temperature=0)
    choice = out.choices[0]
    assert out.model == role
    assert isinstance(choice.message.content, str)  # may be empty: the random model can end at once
    assert choice.finish_reason in {"stop", "length"}
    assert out.usage.prompt_tokens > 5
    assert 1 <= out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_stream_matches_non_stream_at_temperature_zero(openai_client: OpenAI) -> None:
    kwargs = dict(model="planner", messages=PROMPT, max_tokens=24, temperature=0)
    whole = openai_client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(openai_client.chat.completions.create(**kwargs, stream=True,
                                                        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_n_two_gives_two_choices(openai_client: OpenAI) -> None:
    out = openai_client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=16, n=2,
                                                temperature=1.0, seed=3)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert all(isinstance(c.message.content, str) for c in out.choices)


def test_stop_string_ends_the_completion(openai_client: OpenAI) -> None:
    kwargs = dict(model="executor", messages=PROMPT, max_tokens=40, temperature=0)
    full = openai_client.chat.completions.create(**kwargs).choices[0].message.content
    assert len(full) > 12, full
    stop = full[8:11]
    cut = openai_client.chat.completions.create(**kwargs, stop=[stop]).choices[0]
    assert cut.message.content == full[: full.index(stop)]
    assert cut.finish_reason == "stop"


def test_seed_reproducible_at_positive_temperature(openai_client: OpenAI) -> None:
    def sample(seed: int) -> str:
        return openai_client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=24,
                                                     temperature=1.0, seed=seed).choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (7, 8, 9)}) > 1


def test_a_seeded_prompt_longer_than_one_step_samples_as_if_in_one(openai_client: OpenAI,
                                                                      tiny_server) -> None:
    """vLLM prefills a prompt over its step budget (2048 tokens on a CPU) in chunks and drops the token it
    samples after each chunk but the last, rewinding the request's seeded generator: on a CPU that rewind
    used to raise in the worker and end the engine (``engines/cpu/worker.py``). The second request finds
    the prompt in the prefix cache and prefills in one step: its tokens are the chunked one's."""
    messages = [{"role": "user", "content": " ".join(f"seeded{i}" for i in range(600))}]

    def sample() -> tuple[int, str]:
        out = openai_client.chat.completions.create(model="planner", messages=messages, max_tokens=16,
                                                    temperature=1.0, seed=11)
        return out.usage.prompt_tokens, out.choices[0].message.content

    (prompt_tokens, chunked), (_, cached) = sample(), sample()
    assert prompt_tokens > 2048
    assert chunked == cached
    assert httpx.get(f"{tiny_server.base_url}/health", timeout=10).status_code == 200


def _top_logprobs(client: OpenAI, model: str) -> list[float]:
    out = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=1, temperature=0,
                                         logprobs=True, top_logprobs=5)
    content = out.choices[0].logprobs.content
    assert len(content) == 1 and len(content[0].top_logprobs) == 5
    return [t.logprob for t in content[0].top_logprobs]


def test_adapter_changes_logprobs_against_the_base(openai_client: OpenAI) -> None:
    base = _top_logprobs(openai_client, "tiny")
    planner = _top_logprobs(openai_client, "planner")
    assert base == _top_logprobs(openai_client, "manager")  # the manager is the bare base model
    assert max(abs(a - b) for a, b in zip(base, planner)) > 1e-3


async def test_32_concurrent_requests_all_succeed(async_openai_client) -> None:
    async def one(i: int) -> str:
        out = await async_openai_client.chat.completions.create(
            model=ROLES[i % 3], messages=[{"role": "user", "content": f"Question number {i}?"}], max_tokens=16)
        return out.choices[0].message.content

    results = await asyncio.gather(*(one(i) for i in range(32)))
    assert len(results) == 32 and all(isinstance(r, str) for r in results)


def test_health_and_metrics(tiny_server) -> None:
    assert httpx.get(f"{tiny_server.base_url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{tiny_server.base_url}/metrics").text
    assert 'mia_requests_total{model="planner",status="ok"}' in text
    assert "mia_request_latency_seconds_bucket" in text
    assert 'mia_completion_tokens_total{model="executor"}' in text


def test_health_answered_503_while_the_engines_started(tiny_server) -> None:
    seen = tiny_server.health_before_ready
    assert seen, "the server was ready before its first health check (it should listen before the engines are up)"
    assert all(r.status_code == 503 and r.json()["error"]["code"].endswith("_not_ready") for r in seen)
    assert seen[0].json()["error"]["code"] in {"engine_not_ready", "memory_not_ready"}


def test_client_disconnect_mid_stream_aborts_the_request(tiny_server) -> None:
    headers = {"Authorization": f"Bearer {tiny_server.api_key}"}
    body = {"model": "executor", "messages": PROMPT, "max_tokens": 900, "temperature": 1.0, "stream": True}

    def cancelled_count() -> float:
        for line in httpx.get(f"{tiny_server.base_url}/metrics").text.splitlines():
            if line.startswith('mia_requests_total{model="executor",status="cancelled"}'):
                return float(line.split()[-1])
        return 0.0

    before = cancelled_count()
    with httpx.stream("POST", f"{tiny_server.openai_url}/chat/completions", json=body, headers=headers,
                      timeout=60) as response:
        assert response.status_code == 200
        for i, _ in enumerate(response.iter_lines()):
            if i >= 6:
                break
    for _ in range(100):
        if cancelled_count() > before:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert cancelled_count() == before + 1


def test_structured_outputs_regex_and_choice_constrain_the_text(openai_client: OpenAI) -> None:
    """vLLM's ``structured_outputs`` extension: the random model writes only what the constraint allows."""
    regex = r"\[(yes|no)\] [a-z]{3,8}"
    for seed in range(3):
        text = openai_client.chat.completions.create(
            model="executor", messages=PROMPT, max_tokens=32, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"regex": regex}}).choices[0].message.content
        assert re.fullmatch(regex, text), text
    choices = ["red river", "blue river"]
    out = openai_client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=8, n=4,
                                                temperature=1.0, seed=1,
                                                extra_body={"structured_outputs": {"choice": choices}})
    assert {c.message.content for c in out.choices} <= set(choices)


def test_response_format_json_schema_gives_json_of_the_schema(openai_client: OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    out = openai_client.chat.completions.create(
        model="manager", messages=PROMPT, max_tokens=200, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}})
    assert out.choices[0].finish_reason == "stop", out.choices[0].message.content
    assert isinstance(json.loads(out.choices[0].message.content)["ok"], bool)


def test_the_engine_compiles_the_executor_regexes(openai_client: OpenAI) -> None:
    """The agent's turn regexes compile in the engine's structured-output backend and yield parseable
    turns: a fixed search's think block (the call, for a question full of regex and JSON metacharacters,
    written after it) and a free turn."""
    from mia_engine.agent.executor_run import call_text
    from mia_engine.agent.turns import executor_turn_regex, fixed_call_turn, parse_executor_turn, think_regex
    from mia_engine.tools.calls import ToolCall

    question = 'Who wrote "Les Misérables" (1862)? [a.k.a. Les Mis] 50% / 2*3+1 {x} | a\\b ^$'
    call = ToolCall("search", {"query_list": [question]})
    think = think_regex(20)
    free = executor_turn_regex(["search"], max_think_chars=20, max_query_chars=20, max_answer_chars=20)
    for regex in (think, free):
        text = openai_client.chat.completions.create(
            model="executor", messages=PROMPT, max_tokens=400, temperature=0,
            extra_body={"structured_outputs": {"regex": regex}}).choices[0].message.content
        assert re.fullmatch(regex, text), text
        turn = parse_executor_turn(fixed_call_turn(text, call_text(call)) if regex == think else text)
        assert turn.is_well_formed
        assert turn.tool_call == call if regex == think else (turn.tool_call is not None or turn.answer is not None)
