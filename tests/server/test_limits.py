"""Every per-request limit refuses with an OpenAI-style 4xx that names the field, before any work."""

from __future__ import annotations

import httpx
import pytest

from mia_engine.config import LimitsConfig

LIMITS = LimitsConfig()
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
    ({"max_tokens": LIMITS.max_tokens + 1}, "max_tokens"),
    ({"max_completion_tokens": LIMITS.max_tokens + 1}, "max_completion_tokens"),
    ({"stop": ["x"] * (LIMITS.max_stop_sequences + 1)}, "stop"),
    ({"stop": "x" * (LIMITS.max_stop_chars + 1)}, "stop"),
    ({"structured_outputs": {"regex": "a" * (LIMITS.max_regex_chars + 1)}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["c"] * (LIMITS.max_choices + 1)}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["c" * (LIMITS.max_choice_chars + 1)]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": {"enum": ["v" * LIMITS.max_json_schema_bytes]}}}, "structured_outputs.json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "enum": ["v" * LIMITS.max_json_schema_bytes]}}}}, "response_format.json_schema.schema"),
])
def test_chat_limits(tiny_server, extra: dict, param: str) -> None:
    _assert_refused(_post(tiny_server, "/chat/completions", {"model": "planner", "messages": PROMPT, **extra}),
                    400, param)


@pytest.mark.parametrize("extra, param", [
    ({"rollouts": LIMITS.max_rollouts + 1}, "rollouts"),
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


@pytest.mark.parametrize("path", ["\x00", "a\x00b", "", "x" * 5000])
def test_publish_paths_the_os_refuses_are_400(tiny_server, path: str) -> None:
    """Found by tests/server/test_fuzz.py: a NUL byte in ``path`` was a 500."""
    _assert_refused(_post(tiny_server, "/adapters/planner", {"path": path}, key=tiny_server.admin_key), 400, "path")
