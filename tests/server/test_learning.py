"""Test-time learning on the live server: GRPO updates reach the `planner` endpoint without a restart,
bad updates are rejected, rollback restores the previous version exactly."""

from __future__ import annotations

import asyncio
import json

import httpx
import psutil
from openai import OpenAI

PROMPT = [{"role": "user", "content": "Write a plan to find the year the oldest university was founded."}]
COMPLETIONS = ["Search the founding year first.", "Check two sources.", "Ask the archive.", "Compare dates."]
"""Fixed completions for the tests that need an update to run, whatever the current adapter would sample."""


def _first_token(client: OpenAI) -> dict[str, float]:
    out = client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=1, temperature=0,
                                         logprobs=True, top_logprobs=8)
    return {t.token: t.logprob for t in out.choices[0].logprobs.content[0].top_logprobs}


def _post(server, path: str, body: dict | None = None) -> httpx.Response:
    return server.admin_post(path, body)


def _grpo(server, winner: str, losers: list[str], reward: str = "1.0") -> httpx.Response:
    """``reward`` is JSON text, so that a poisoned value (``1e400`` = inf) can be sent."""
    completions = [{"text": winner, "reward": "REWARD"}] + [{"text": t, "reward": 0.0} for t in losers]
    body = json.dumps({"groups": [{"messages": PROMPT, "completions": completions}]}).replace('"REWARD"', reward)
    return httpx.post(f"{server.openai_url}/adapters/planner/grpo", content=body, timeout=300,
                      headers={"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/json"})


def _pids(server) -> set[int]:
    return {p.pid for p in psutil.Process(server.process.pid).children(recursive=True)}


def test_learning_reaches_serving_and_rollback_restores(own_server, own_openai_client: OpenAI) -> None:
    pids = _pids(own_server)
    before = _first_token(own_openai_client)
    ranked = sorted(before, key=before.get, reverse=True)
    target, losers = ranked[2], [ranked[0], ranked[1], ranked[4]]

    first = _grpo(own_server, target, losers)
    assert first.status_code == 200, first.text
    assert first.json()["is_published"], first.json()
    after_one = _first_token(own_openai_client)
    for _ in range(2):
        assert _grpo(own_server, target, losers).json()["is_published"]
    after = _first_token(own_openai_client)
    assert after.get(target, -99.0) > before[target] + 0.05, (before, after)
    assert _pids(own_server) == pids, "the engine was restarted"

    rolled = _post(own_server, "/adapters/planner/rollback")
    assert rolled.status_code == 200, rolled.text
    rolled_twice = _post(own_server, "/adapters/planner/rollback")
    assert rolled_twice.status_code == 200
    assert _first_token(own_openai_client) == after_one  # exactly the version after the first update


def test_poisoned_update_is_rejected_and_serving_is_unchanged(own_server, own_openai_client: OpenAI) -> None:
    before = _first_token(own_openai_client)
    texts = COMPLETIONS
    assert _grpo(own_server, texts[0], texts[1:3], reward="1e400").status_code == 400  # inf: not JSON-finite
    # finite rewards whose group mean overflows: the update itself goes non-finite and must be refused
    response = _post(own_server, "/adapters/planner/grpo", {"groups": [{"messages": PROMPT, "completions": [
        {"text": texts[0], "reward": 1.7e308}, {"text": texts[1], "reward": 1.7e308},
        {"text": texts[2], "reward": -1.0}]}]})
    assert response.status_code == 200, response.text
    report = response.json()
    assert not report["is_published"] and "non-finite" in report["reason"]
    assert _first_token(own_openai_client) == before
    assert 'mia_learner_updates_total{outcome="rejected"}' in httpx.get(f"{own_server.base_url}/metrics").text


async def test_32_requests_succeed_while_an_update_is_published(own_server, own_async_openai_client,
                                                                own_openai_client: OpenAI) -> None:
    async def ask(i: int) -> str:
        out = await own_async_openai_client.chat.completions.create(
            model="planner", messages=[{"role": "user", "content": f"plan {i}"}], max_tokens=48, temperature=1.0)
        return out.choices[0].message.content

    requests = [asyncio.ensure_future(ask(i)) for i in range(32)]
    await asyncio.sleep(0.2)
    update = await asyncio.to_thread(_grpo, own_server, COMPLETIONS[0], COMPLETIONS[1:4])
    results = await asyncio.gather(*requests)
    assert update.status_code == 200 and update.json()["is_published"]
    assert len(results) == 32 and all(isinstance(r, str) for r in results)


def test_bad_learning_requests(own_server) -> None:
    assert _post(own_server, "/adapters/executor/rollback").status_code == 404
    bad = _post(own_server, "/adapters/planner/grpo", {"groups": [{"messages": PROMPT, "completions": [
        {"text": "only one", "reward": 1.0}]}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("groups")


def test_learning_questions_feed_online_updates(own_server, own_admin_openai_client: OpenAI) -> None:
    def updates() -> float:
        total = 0.0
        for line in httpx.get(f"{own_server.base_url}/metrics").text.splitlines():
            if line.startswith("mia_learner_updates_total"):
                total += float(line.split()[-1])
        return total

    before = updates()
    for i in range(2):  # learner.batch_size = 2 in configs/tiny.toml
        own_admin_openai_client.chat.completions.create(
            model="mia", messages=[{"role": "user", "content": f"Which city is on river number {i}?"}],
            extra_body={"rollouts": 4, "learn": True, "ground_truth": ["Paris"]})
    for _ in range(100):
        if updates() > before:
            break
        asyncio.run(asyncio.sleep(0.2))
    assert updates() == before + 1  # published, or rejected for equal rewards: an update ran either way
