"""``/v1/completions`` and the sampling fields vLLM accepts (``logit_bias``, ``top_k``, ``min_p``,
``repetition_penalty``), with the real ``openai`` client against the real tiny server."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from tests.conftest import ServerHandle, scrape_metrics

PROMPT = "The longest river in the world is"
CHAT = [{"role": "user", "content": "Which river is the longest in the world?"}]


def _post(server: ServerHandle, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {server.api_key}"})


def _tokens(server: ServerHandle, model: str, text: str) -> list[int]:
    response = _post(server, "/tokenize", {"model": model, "prompt": text})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def _text(server: ServerHandle, model: str, ids: list[int]) -> str:
    response = _post(server, "/detokenize", {"model": model, "tokens": ids})
    assert response.status_code == 200, response.text
    return response.json()["prompt"]


def test_completion_plain(openai_client: OpenAI, tiny_server: ServerHandle) -> None:
    out = openai_client.completions.create(model="manager", prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.model == "manager"
    (choice,) = out.choices
    assert isinstance(choice.text, str) and choice.finish_reason in {"stop", "length"}
    assert out.usage.prompt_tokens == len(_tokens(tiny_server, "manager", PROMPT))
    assert 1 <= out.usage.completion_tokens <= 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_completion_stream_matches_whole(openai_client: OpenAI, tiny_server: ServerHandle) -> None:
    kwargs = dict(model="planner", prompt=PROMPT, max_tokens=16, temperature=0)
    whole = openai_client.completions.create(**kwargs).choices[0].text
    chunks = list(openai_client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    raw = _post(tiny_server, "/v1/completions", {**kwargs, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_completion_list_prompt_with_n(openai_client: OpenAI) -> None:
    out = openai_client.completions.create(model="planner", prompt=[PROMPT, "Rivers flow into"], n=2,
                                           max_tokens=6, temperature=1.0, seed=5)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]


def test_completion_token_ids_prompt_equals_text(openai_client: OpenAI, tiny_server: ServerHandle) -> None:
    kwargs = dict(model="manager", max_tokens=10, temperature=0)
    by_text = openai_client.completions.create(prompt=PROMPT, **kwargs).choices[0].text
    ids = _tokens(tiny_server, "manager", PROMPT)
    by_ids = openai_client.completions.create(prompt=ids, **kwargs)
    assert by_ids.choices[0].text == by_text
    batched = openai_client.completions.create(prompt=[ids, ids], **kwargs)
    assert [c.text for c in batched.choices] == [by_text, by_text]


def test_completion_logprobs_and_echo(openai_client: OpenAI) -> None:
    out = openai_client.completions.create(model="manager", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    logprobs = out.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == out.usage.completion_tokens
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == out.choices[0].text
    echoed = openai_client.completions.create(model="manager", prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + out.choices[0].text


@pytest.mark.parametrize("body, param", [
    ({"model": "mia"}, "model"),
    ({"suffix": "the end"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"prompt": [PROMPT, 5]}, "prompt"),
    ({"prompt": ["x"] * 129}, "prompt"),  # server.limits.max_completion_choices: each is an engine request
    ({"prompt": ["x"] * 9, "n": 16}, "prompt"),  # 144 choices
    ({"prompt": [[1, 2]] * 129}, "prompt"),  # token-id prompts are choices too
    ({"prompt": [[1, 2]] * 9, "n": 16}, "prompt"),
    ({"logit_bias": {"river": 5}}, "logit_bias"),
])
def test_completion_refusals_name_the_field(tiny_server: ServerHandle, body: dict, param: str) -> None:
    response = _post(tiny_server, "/v1/completions", {"model": "manager", "prompt": PROMPT, "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def _admitted(server: ServerHandle, key: str) -> float:
    return next((s.value for s in scrape_metrics(server)
                 if s.name == "mia_admission_wait_seconds_count" and s.labels.get("key") == key), 0.0)


@pytest.mark.parametrize("prompt, param", [
    (["x", "y" * (4096 * 16 + 1)], "prompt[1]"),  # the second text is past the characters a context may hold
    ([1] * 4096, "prompt"),  # token ids that fill the context leave no room to generate
    ([[1, 2], [1] * 5000], "prompt[1]"),
    (["x"] * 64 + [[1] * 4095], "prompt"),  # a list of texts and ids is none of the four shapes
])
def test_every_prompt_is_sized_before_the_slot_and_before_any_is_tokenised(tiny_server: ServerHandle,
                                                                          prompt: list, param: str) -> None:
    """A list whose last prompt is too long is refused before the request queues for its model's slot, so
    before the prompts ahead of it are tokenised."""
    before = _admitted(tiny_server, "model:manager")
    response = _post(tiny_server, "/v1/completions", {"model": "manager", "prompt": prompt, "max_tokens": 4})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
    assert _admitted(tiny_server, "model:manager") == before


def _biased_token(tiny_server: ServerHandle, greedy: str) -> tuple[int, str]:
    """A plain word's token whose text differs from the greedy first token."""
    for word in (" river", " Nile", " water"):
        (token_id, *_) = _tokens(tiny_server, "manager", word)
        text = _text(tiny_server, "manager", [token_id])
        if text and text != greedy:
            return token_id, text
    raise AssertionError("no candidate token differs from the greedy one")


def test_logit_bias_forces_the_first_token(openai_client: OpenAI, tiny_server: ServerHandle) -> None:
    kwargs = dict(model="manager", prompt=PROMPT, max_tokens=1, temperature=0)
    greedy = openai_client.completions.create(**kwargs).choices[0].text
    token_id, text = _biased_token(tiny_server, greedy)
    biased = openai_client.completions.create(**kwargs, logit_bias={str(token_id): 100})
    assert biased.choices[0].text == text
    chat_kwargs = dict(model="manager", messages=CHAT, max_tokens=1, temperature=0)
    chat_greedy = openai_client.chat.completions.create(**chat_kwargs).choices[0].message.content
    token_id, text = _biased_token(tiny_server, chat_greedy)
    chat_biased = openai_client.chat.completions.create(**chat_kwargs, logit_bias={str(token_id): 500})  # clamped
    assert chat_biased.choices[0].message.content == text


def _below_top(choice) -> int:
    """How many sampled tokens had a lower logprob than the position's most likely token (ties count as top)."""
    return sum(position.logprob < max(top.logprob for top in position.top_logprobs) - 1e-5
               for position in choice.logprobs.content)


@pytest.mark.parametrize("field", [{"top_k": 1}, {"min_p": 1.0}])
def test_top_k_one_and_min_p_one_are_greedy(openai_client: OpenAI, field: dict) -> None:
    # Greedy means each sampled token is a most likely one at its position; comparing whole texts with a
    # temperature-0 run would also compare how exact logit ties are broken, which vLLM leaves to chance.
    kwargs = dict(model="planner", messages=CHAT, max_tokens=24, temperature=1.5, logprobs=True, top_logprobs=3)
    sampled = [openai_client.chat.completions.create(**kwargs, seed=s).choices[0] for s in (1, 2)]
    assert sum(map(_below_top, sampled)) > 0, "without the field the sampling must leave the top token"
    narrowed = [openai_client.chat.completions.create(**kwargs, seed=s, extra_body=field).choices[0] for s in (1, 2)]
    assert [_below_top(choice) for choice in narrowed] == [0, 0]


def test_repetition_penalty_is_applied(openai_client: OpenAI, tiny_server: ServerHandle) -> None:
    kwargs = dict(model="manager", prompt=PROMPT, max_tokens=24, temperature=0)
    plain = openai_client.completions.create(**kwargs).choices[0].text
    penalised = openai_client.completions.create(**kwargs, extra_body={"repetition_penalty": 1.8}).choices[0].text
    assert penalised != plain
    response = _post(tiny_server, "/v1/chat/completions", {"model": "manager", "messages": CHAT,
                                                             "repetition_penalty": 0})
    assert response.status_code == 400 and response.json()["error"]["param"] == "repetition_penalty"


def test_raw_only_fields_are_refused_for_the_agent(tiny_server: ServerHandle) -> None:
    for field in ({"top_k": 1}, {"logit_bias": {"1": 1.0}}, {"min_p": 0.1}):
        response = _post(tiny_server, "/v1/chat/completions", {"model": "mia", "messages": CHAT, **field})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == next(iter(field))


def test_tokenize_detokenize_round_trip_and_version(tiny_server: ServerHandle, openai_client: OpenAI) -> None:
    tokenized = _post(tiny_server, "/tokenize", {"model": "planner", "prompt": PROMPT}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) > 3
    assert tokenized["max_model_len"] == 4096
    assert _text(tiny_server, "planner", tokenized["tokens"]) == PROMPT
    chat = _post(tiny_server, "/tokenize", {"model": "planner", "messages": CHAT}).json()
    usage = openai_client.chat.completions.create(model="planner", messages=CHAT, max_tokens=1).usage
    assert chat["count"] == usage.prompt_tokens
    out_of_vocab = _post(tiny_server, "/detokenize", {"model": "planner", "tokens": [10**9]})
    assert out_of_vocab.status_code == 400 and out_of_vocab.json()["error"]["param"] == "tokens"
    assert _post(tiny_server, "/tokenize", {"model": "mia", "prompt": "x"}).json()["error"]["param"] == "model"
    keyless = httpx.post(f"{tiny_server.base_url}/tokenize", json={"model": "planner", "prompt": PROMPT})
    assert keyless.status_code == 401  # tokenising costs the engines' CPU: keyed like /v1
    from mia_engine import __version__

    version = httpx.get(f"{tiny_server.base_url}/version", headers={"Authorization": f"Bearer {tiny_server.api_key}"})
    assert version.status_code == 200 and version.json()["version"] == __version__


def test_unknown_fields_are_logged_not_dropped_silently(tiny_server: ServerHandle) -> None:
    response = _post(tiny_server, "/v1/completions", {"model": "manager", "prompt": PROMPT, "max_tokens": 2,
                                                      "bad_words_unknown_here": ["x"]})
    assert response.status_code == 200
    assert "the request's fields 'bad_words_unknown_here' are not supported" in tiny_server.log_tail(400)


def test_ignore_eos_and_min_tokens(openai_client: OpenAI) -> None:
    out = openai_client.completions.create(model="manager", prompt=PROMPT, max_tokens=40, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 40
    out = openai_client.chat.completions.create(model="manager", messages=CHAT, max_tokens=30, temperature=0,
                                                extra_body={"min_tokens": 30})
    assert out.usage.completion_tokens == 30


def test_completion_structured_outputs(openai_client: OpenAI, tiny_server: ServerHandle) -> None:
    out = openai_client.completions.create(model="manager", prompt=PROMPT, max_tokens=8, temperature=0,
                                           extra_body={"structured_outputs": {"choice": ["Nile", "Amazon"]}})
    assert out.choices[0].text in {"Nile", "Amazon"}
    response = _post(tiny_server, "/v1/completions", {"model": "manager", "prompt": PROMPT, "structured_outputs": {
        "regex": "a", "choice": ["b"]}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "structured_outputs"
