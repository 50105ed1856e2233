"""The test-time learner's process killed under learning requests, on the live server: every request
answers, ``/health`` stays 200 and reports the restart, every acknowledged batch still gets its update,
and a later update publishes a new Planner version from the fresh learner."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
from openai import OpenAI

from mia_engine.learner.process import PROCESS_NAME

from .test_learning import COMPLETIONS, _grpo

DEADLINE_S = 180.0


def _learner_pid(server) -> int:
    found = [p.pid for p in psutil.Process(server.process.pid).children() if p.name() == PROCESS_NAME]
    assert len(found) == 1, found
    return found[0]


def _num_updates(server) -> float:
    lines = httpx.get(f"{server.base_url}/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("mia_learner_updates_total"))


def _planner_version(server) -> int:
    listing = httpx.get(f"{server.openai_url}/adapters", headers={"Authorization": f"Bearer {server.api_key}"})
    return max(a["version"] for a in listing.json()["data"] if a["role"] == "planner" and a["is_live"])


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_learner_killed_under_learning_requests_is_restarted_and_serving_goes_on(
        own_server, own_admin_openai_client: OpenAI) -> None:
    def ask(i: int) -> str | None:
        out = own_admin_openai_client.chat.completions.create(  # raises on any answer but 200
            model="mia", messages=[{"role": "user", "content": f"Which city is on river number {i}?"}],
            extra_body={"rollouts": 4, "learn": True, "ground_truth": ["Paris"]})
        return out.choices[0].message.content

    first, updates_before, version_before = _learner_pid(own_server), _num_updates(own_server), \
        _planner_version(own_server)
    with ThreadPoolExecutor(4) as pool:
        requests = [pool.submit(ask, i) for i in range(4)]  # learner.batch_size = 2: two updates' worth
        time.sleep(1.0)
        assert not any(r.done() for r in requests)
        os.kill(first, signal.SIGKILL)
        answers = [r.result() for r in requests]
    assert all(isinstance(a, str) for a in answers)

    def restarted() -> bool:
        health = httpx.get(f"{own_server.base_url}/health")
        assert health.status_code == 200, health.text
        learning = health.json().get("learning")
        return learning is not None and learning["num_restarts"] == 1

    _until(restarted, "/health to report the restart")
    learning = httpx.get(f"{own_server.base_url}/health").json()["learning"]
    assert learning["status"] == "restarted" and "killed by SIGKILL" in learning["last_failure"]
    fresh = _learner_pid(own_server)
    assert fresh != first
    _until(lambda: _num_updates(own_server) >= updates_before + 2, "both batches' updates")  # none lost
    update = _grpo(own_server, COMPLETIONS[0], COMPLETIONS[1:4])
    assert update.status_code == 200 and update.json()["is_published"], update.text
    assert update.json()["adapter_version"] > version_before
    assert _learner_pid(own_server) == fresh
    assert httpx.get(f"{own_server.base_url}/health").json()["learning"]["num_restarts"] == 1
