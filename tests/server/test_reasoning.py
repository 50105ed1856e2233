"""``engines.<name>.reasoning_parser`` on a real server (``vllm serve --reasoning-parser``): vLLM's DeepSeek-R1
parser on the tiny engine splits the thinking into ``reasoning_content``, whole and streamed, and the tool-call
parser reads the content after it.

The random tiny model never closes a think block by itself, so a regex writes one (the engine constrains the
thinking too: ``structured_outputs_in_reasoning``), and ``logit_bias`` makes the think tags the vocabulary's
own tokens (the reasoning parsers find them by token id while streaming)."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from tests.conftest import SERVING_ONLY, ServerHandle, _openai, launch_tiny, server_fixture

reasoning_server = server_fixture("reasoning_server", launch_tiny(
    "reasoning_server", "--engines.tiny.reasoning_parser=deepseek_r1",
    "--engines.tiny.structured_outputs_in_reasoning=true", "--engines.tiny.warmup_max_seqs=0", *SERVING_ONLY))
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
THINKING = {"regex": r"abc</think>def"}
"""A thought and an answer, the think block opened by the prompt (as DeepSeek-R1's template does)."""
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(reasoning_server: ServerHandle) -> OpenAI:
    return _openai(reasoning_server, 120)


@pytest.fixture(scope="module")
def think_tags(reasoning_server: ServerHandle) -> dict[str, float]:
    """``logit_bias`` that makes ``<think>`` and ``</think>`` their own tokens wherever the regex allows them."""
    response = httpx.post(f"{reasoning_server.base_url}/tokenize", timeout=30,
                          headers={"Authorization": f"Bearer {reasoning_server.api_key}"},
                          json={"model": "manager", "prompt": "<think></think>", "add_special_tokens": False})
    tokens = response.json()["tokens"]
    assert len(tokens) == 2, tokens
    return {str(t): 100 for t in tokens}


def _ask(client: OpenAI, think_tags: dict[str, float], **kwargs):
    return client.chat.completions.create(model="manager", messages=CHAT, max_tokens=64, temperature=0,
                                          logit_bias=think_tags, **kwargs)


def test_the_thinking_comes_apart_from_the_content(client: OpenAI, think_tags: dict[str, float]) -> None:
    choice = _ask(client, think_tags, extra_body={"structured_outputs": THINKING}).choices[0]
    assert choice.message.model_extra["reasoning_content"] == "abc"
    assert choice.message.content == "def"
    assert choice.finish_reason == "stop"


def test_a_stream_sends_the_thinking_then_the_content(client: OpenAI, think_tags: dict[str, float]) -> None:
    chunks = list(_ask(client, think_tags, stream=True, extra_body={"structured_outputs": THINKING}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thinking = [d.model_extra.get("reasoning_content") for d in deltas]
    content = [d.content for d in deltas]
    assert "".join(t or "" for t in thinking) == "abc" and "".join(c or "" for c in content) == "def", deltas
    last_thought = max(i for i, t in enumerate(thinking) if t)
    assert last_thought <= min(i for i, c in enumerate(content) if c)  # the thinking first (a chunk may end it)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_the_tool_call_parser_reads_what_follows_the_thinking(client: OpenAI, think_tags: dict[str, float]) -> None:
    written = {"regex": r'x</think><tool_call>\{"name": "get_weather", "arguments": \{"city": "Rome"\}\}'
                        r'</tool_call>'}
    choice = _ask(client, think_tags, tools=[WEATHER], extra_body={"structured_outputs": written}).choices[0]
    assert choice.message.model_extra["reasoning_content"] == "x"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}
    assert choice.finish_reason == "tool_calls"
