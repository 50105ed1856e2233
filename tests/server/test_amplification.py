"""Requests that would cost the server far more than their size: everything a chat prompt carries is counted
before it is tokenised, ``/tokenize`` and ``/detokenize`` are bounded and take a slot, and log-probs have one
budget per request (``server.limits.max_logprob_entries``). Through the real tiny server (4,096-token context)."""

from __future__ import annotations

import httpx
import pytest

from mia_engine.config import LimitsConfig
from mia_engine.server.errors import BadRequest
from mia_engine.server.limits import check_logprob_entries
from tests.conftest import ServerHandle, scrape_metrics

LIMITS = LimitsConfig()
MAX_MODEL_LEN = 4096
"""The tiny engine's context, in tokens."""
OVER = "x" * (MAX_MODEL_LEN * LIMITS.max_chars_per_token + 1)
"""More characters than any prompt of the tiny engine may have before it is tokenised."""
CALL = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "search", "description": "Search the web."}}


def _post(server: ServerHandle, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {server.api_key}"})


def _error(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _admitted(server: ServerHandle, key: str) -> float:
    """Requests admitted to ``key``'s slots since the server started."""
    return next((s.value for s in scrape_metrics(server)
                 if s.name == "mia_admission_wait_seconds_count" and s.labels.get("key") == key), 0.0)


def _with(message: dict) -> list[dict]:
    return [{"role": "user", "content": "hello"}, message]


@pytest.mark.parametrize("extra", [
    pytest.param({"tools": [{**TOOL, "function": {**TOOL["function"], "description": OVER}}]}, id="tool-definition"),
    pytest.param({"messages": _with({"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "search", "arguments": OVER}}]})}, id="tool-call-arguments"),
    pytest.param({"messages": _with({"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": OVER, "arguments": "{}"}}]})}, id="tool-call-name"),
    pytest.param({"messages": _with({"role": "tool", "content": "1", "tool_call_id": OVER})}, id="tool-call-id"),
    pytest.param({"messages": [{"role": "user", "content": "hello", "name": OVER}]}, id="name"),
    pytest.param({"messages": [{"role": "user", "content": [{"type": "text", "text": OVER[:40_000]},
                                                            {"type": "text", "text": OVER[40_000:]}]}]},
                 id="text-parts"),
])
def test_everything_a_prompt_carries_is_counted_before_it_is_tokenised(tiny_server: ServerHandle,
                                                                       extra: dict) -> None:
    """A short message with a huge tool definition, call or name is as long a prompt as a huge message: refused
    by its characters (the message says so), not after the tokenizer has read it, nor rendered unread."""
    body = {"model": "planner", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1, **extra}
    error = _error(_post(tiny_server, "/v1/chat/completions", body))
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded", error
    assert "characters" in error["message"], error


def test_tokenize_and_detokenize_are_bounded_before_the_tokenizer(tiny_server: ServerHandle) -> None:
    prompt = _error(_post(tiny_server, "/tokenize", {"model": "planner", "prompt": OVER}))
    assert prompt["param"] == "prompt" and "characters" in prompt["message"], prompt
    messages = _error(_post(tiny_server, "/tokenize", {"model": "planner", "messages": [
        {"role": "user", "content": "hi", "tool_calls": [{**CALL, "function": {"name": "s", "arguments": OVER}}]}]}))
    assert messages["param"] == "messages" and "characters" in messages["message"], messages
    ids = _error(_post(tiny_server, "/detokenize", {"model": "planner", "tokens": [1] * (MAX_MODEL_LEN + 1)}))
    assert ids["param"] == "tokens" and ids["code"] == "limit_exceeded", ids
    whole = _post(tiny_server, "/detokenize", {"model": "planner", "tokens": [1] * MAX_MODEL_LEN})
    assert whole.status_code == 200, whole.text  # a whole context's ids (prompt and completion) still read


def test_tokenize_and_detokenize_take_a_slot_of_their_model(tiny_server: ServerHandle) -> None:
    """They share the engine's tokenizer threads with chat: bounded per model like chat (key ``tokenize:<model>``,
    so they never wait behind a generation)."""
    before = _admitted(tiny_server, "tokenize:planner")
    assert _post(tiny_server, "/tokenize", {"model": "planner", "prompt": "hello"}).status_code == 200
    assert _post(tiny_server, "/detokenize", {"model": "planner", "tokens": [1, 2]}).status_code == 200
    assert _admitted(tiny_server, "tokenize:planner") == before + 2


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 16, "max_tokens": 2000,
                              "logprobs": True, "top_logprobs": 20}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 16, "max_tokens": 4000,
                              "logprobs": True, "top_logprobs": 8}, "top_logprobs"),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 8, "max_tokens": 2000, "logprobs": 20}, "logprobs"),
    ("/v1/completions", {"prompt": [[1, 2]] * 8, "n": 16, "max_tokens": 4000, "logprobs": 1}, "logprobs"),
])
def test_a_log_prob_reply_past_the_budget_is_refused_before_its_slot(tiny_server: ServerHandle, path: str,
                                                                     body: dict, param: str) -> None:
    """n x prompts x max_tokens x (top + 1) entries, each built, held and encoded by the server: refused before
    the request takes its model's slot (so before its prompt is tokenised)."""
    before = _admitted(tiny_server, "model:planner")
    error = _error(_post(tiny_server, path, {"model": "planner", **body}))
    assert error["param"] == param and error["code"] == "limit_exceeded", error
    assert "server.limits.max_logprob_entries" in error["message"], error
    assert _admitted(tiny_server, "model:planner") == before


def test_a_log_prob_budget_left_to_the_context_is_checked_once_it_is_known(tiny_server: ServerHandle) -> None:
    """Without max_tokens, eight completions may fill what the 4,096-token context leaves: 8 x ~4,080 x 21
    entries, refused once the prompt's length is known, before any engine request."""
    body = {"model": "planner", "messages": [{"role": "user", "content": "hi"}], "n": 8, "logprobs": True,
            "top_logprobs": 20}
    error = _error(_post(tiny_server, "/v1/chat/completions", body))
    assert error["param"] == "top_logprobs" and error["code"] == "limit_exceeded", error
    small = _post(tiny_server, "/v1/chat/completions", {**body, "n": 1, "max_tokens": 4})
    assert small.status_code == 200 and small.json()["choices"][0]["logprobs"]["content"], small.text


@pytest.mark.parametrize("num_tokens, num_top", [
    (24_000, 20), (6 * MAX_MODEL_LEN, 20), (16 * MAX_MODEL_LEN, 1), (16 * 3072, 5)])
def test_the_default_budget_lets_a_normal_client_through(num_tokens: int, num_top: int) -> None:
    """One completion of thousands of tokens with 20 top log-probs, six over a whole 4,096-token context,
    n = 16 of them with one top candidate, or what ``test_event_loop`` builds off the loop (16 x 3,072 x 6)."""
    check_logprob_entries("top_logprobs", num_tokens, num_top, LIMITS)


def test_the_default_budget_refuses_the_largest_reply_the_other_caps_allow() -> None:
    with pytest.raises(BadRequest) as refused:
        check_logprob_entries("top_logprobs", 16 * 4096, 20, LIMITS)  # n = 16 x 4,096 tokens x 21
    assert refused.value.param == "top_logprobs"
