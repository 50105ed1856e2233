"""Every error case of the endpoint: status code and OpenAI-style error body."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI


PROMPT = [{"role": "user", "content": "hello"}]


def post(server, body, *, raw: bytes | None = None, key: str | None = "use-server", path="/v1/chat/completions"):
    headers = {"Content-Type": "application/json"}
    if key == "use-server":
        key = server.api_key
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(server.base_url + path, json=None if raw is not None else body, content=raw,
                      headers=headers, timeout=60)


def assert_error(response: httpx.Response, status: int, *, param: str | None = None, code: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def test_malformed_json_is_400(tiny_server) -> None:
    error = assert_error(post(tiny_server, None, raw=b'{"model": "planner", "messages": ['), 400)
    assert "Malformed JSON" in error["message"]


def test_empty_body_is_400(tiny_server) -> None:
    assert_error(post(tiny_server, None, raw=b""), 400)


@pytest.mark.parametrize("body, param", [
    ({"model": "planner", "messages": PROMPT, "max_tokens": "many"}, "max_tokens"),
    ({"model": "planner", "messages": PROMPT, "temperature": 7}, "temperature"),
    ({"model": "planner", "messages": PROMPT, "n": 0}, "n"),
    ({"model": "planner", "messages": PROMPT, "n": 1000}, "n"),
    ({"model": "planner", "messages": []}, "messages"),
    ({"model": "planner"}, None),
    ({"model": 5, "messages": PROMPT}, "model"),
    ({"model": "planner", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": "planner", "messages": [{"role": "user", "content": [{"type": "image_url",
                                       "image_url": {"url": "file:///x.png"}}]}]}, "messages[0].content[0].image_url"),
    ({"model": "planner", "messages": PROMPT, "top_logprobs": 3}, "top_logprobs"),
    ({"model": "planner", "messages": PROMPT, "structured_outputs": {}}, "structured_outputs"),
    ({"model": "planner", "messages": PROMPT, "structured_outputs": {"regex": "a", "choice": ["b"]}},
     "structured_outputs"),
    ({"model": "planner", "messages": PROMPT, "structured_outputs": {"json": "{nope"}}, "structured_outputs.json"),
    ({"model": "planner", "messages": PROMPT, "structured_outputs": {"grammar": "x"}}, "structured_outputs"),
    ({"model": "planner", "messages": PROMPT, "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ({"model": "planner", "messages": PROMPT, "response_format": {"type": "yaml"}}, "response_format.type"),
    ([1, 2, 3], None),
])
def test_wrong_fields_are_400_naming_the_field(tiny_server, body, param) -> None:
    error = assert_error(post(tiny_server, body), 400)
    if param is not None:
        assert error["param"] == param


def test_unknown_model_is_404(tiny_server) -> None:
    assert_error(post(tiny_server, {"model": "gpt-9", "messages": PROMPT}), 404, param="model",
                 code="model_not_found")
    assert_error(httpx.get(f"{tiny_server.openai_url}/models/gpt-9",
                           headers={"Authorization": f"Bearer {tiny_server.api_key}"}), 404)


@pytest.mark.parametrize("body, param", [
    ({"model": "mia", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///x.png"}}]}]}, "messages[0].content[0].image_url"),
    ({"model": "mia", "messages": [{"role": "user", "content": "  "}]}, "messages[0].content"),
    ({"model": "mia", "messages": [{"role": "system", "content": "no question"}]}, "messages"),
    ({"model": "mia", "messages": PROMPT, "rollouts": 999}, "rollouts"),
    ({"model": "mia", "messages": PROMPT, "rollouts": 0}, "rollouts"),
    ({"model": "mia", "messages": PROMPT, "ground_truth": 5}, "ground_truth"),
])
def test_agent_bad_input_is_400(tiny_server, body, param) -> None:
    assert_error(post(tiny_server, body), 400, param=param)


def test_unknown_path_is_404_json(tiny_server) -> None:
    assert_error(post(tiny_server, {}, path="/v1/nothing/here"), 404)


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_missing_or_wrong_key_is_401(tiny_server, key) -> None:
    assert_error(post(tiny_server, {"model": "planner", "messages": PROMPT}, key=key), 401,
                 code="invalid_api_key")
    if key is not None:  # the openai client itself refuses to send no key at all
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=tiny_server.openai_url, api_key=key, max_retries=0).models.list()


def test_prompt_longer_than_context_is_400(openai_client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(
            model="planner", messages=[{"role": "user", "content": "river " * 5000}], max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=100_000)


def test_huge_body_is_413(tiny_server) -> None:
    raw = b'{"model": "planner", "messages": [{"role": "user", "content": "' + b"a" * (9 * 1024 * 1024) + b'"}]}'
    assert_error(post(tiny_server, None, raw=raw), 413)


def test_server_survives_bad_input(openai_client: OpenAI) -> None:
    out = openai_client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=4)
    assert out.choices[0].message.content is not None


def test_parameters_the_engine_refuses_are_400(openai_client: OpenAI) -> None:
    """vLLM refuses n > 1 with greedy sampling; that is the client's error, not a 500."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            openai_client.chat.completions.create(model="executor", messages=PROMPT, max_tokens=4, n=2,
                                                  temperature=0, stream=stream)
        assert "greedy" in info.value.body["message"]


def test_a_regex_the_engine_cannot_compile_is_400(openai_client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model="executor", messages=PROMPT, max_tokens=4,
                                              extra_body={"structured_outputs": {"regex": "(unclosed"}})
    assert openai_client.chat.completions.create(model="executor", messages=PROMPT, max_tokens=2).choices
