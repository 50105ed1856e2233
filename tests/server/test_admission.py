"""Admission control: a full server answers 429 with Retry-After at once, never hangs, never 5xx."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from mia_engine.config import AdmissionConfig
from mia_engine.server.admission import Admission
from mia_engine.server.errors import TooManyRequests

NUM_CHAT = 200
NUM_RESEARCH = 32


def test_a_full_key_refuses_with_retry_after_and_frees_on_release() -> None:
    admission = Admission(AdmissionConfig(retry_after_s=3))
    admission.acquire("model:planner", 2)
    with admission.slot("model:planner", 2):
        with pytest.raises(TooManyRequests) as info:
            admission.acquire("model:planner", 2, param="model")
        response = info.value.to_response()
        assert response.status_code == 429 and response.headers["retry-after"] == "3"
        admission.acquire("model:executor", 2)  # keys are independent
    admission.acquire("model:planner", 2)  # the slot came back
    assert admission.running("model:planner") == 2
    for key in ("model:planner", "model:planner", "model:executor"):
        admission.release(key)
    assert admission.running("model:planner") == 0


async def _timed(http: httpx.AsyncClient, body: dict) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = await http.post("/chat/completions", json=body)
    return response, time.perf_counter() - start


def _awaiting(task: asyncio.Task) -> Iterator[object]:
    """The chain of what a pending task awaits, outermost first: coroutines (and generators), then the
    future or other awaitable at the bottom."""
    awaited: object = task.get_coro()
    while awaited is not None:
        yield awaited
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None) \
            or getattr(awaited, "ag_await", None)


def _frame(awaited: object):
    return getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None) \
        or getattr(awaited, "ag_frame", None)


def _suspended_at(task: asyncio.Task) -> str:
    """Where a pending task's coroutine chain waits (outermost first), down to the awaited future."""
    where = []
    for awaited in _awaiting(task):
        frame = _frame(awaited)
        if frame is None:
            where.append(type(awaited).__name__)
            break
        where.append(f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}")
    return " -> ".join(where[-8:])


@pytest.mark.slow
@pytest.mark.timeout(900)  # may pay the shared server's start (a fixture's setup counts) before its own 580 s
async def test_200_chat_and_32_research_requests_at_once(tiny_server, record_property) -> None:
    limits = httpx.Limits(max_connections=NUM_CHAT + NUM_RESEARCH + 8)
    headers = {"Authorization": f"Bearer {tiny_server.api_key}"}
    chat = [{"model": "planner", "messages": [{"role": "user", "content": f"Question {i}?"}], "max_tokens": 16}
            for i in range(NUM_CHAT)]
    research = [{"model": "mia", "messages": [{"role": "user", "content": f"Which river flows through city {i}?"}]}
                for i in range(NUM_RESEARCH)]
    async with httpx.AsyncClient(base_url=tiny_server.openai_url, headers=headers, timeout=600,
                                 limits=limits) as http:
        tasks = [asyncio.ensure_future(_timed(http, b)) for b in [*research, *chat]]
        done, pending = await asyncio.wait(tasks, timeout=float(os.environ.get("MIA_TEST_LOAD_WAIT_S", 580)))
        if pending:  # say which never came back, and what the server counted, instead of a bare timeout
            waiting = [("mia" if i < NUM_RESEARCH else "planner", i) for i, t in enumerate(tasks) if t in pending]
            counted = [line for line in httpx.get(f"{tiny_server.base_url}/metrics").text.splitlines()
                       if line.startswith("mia_requests_total")]
            where = [_suspended_at(t) for t in tasks if t in pending][:3]
            for task in pending:
                task.cancel()
            pytest.fail(f"{len(pending)} requests never answered: {waiting[:20]}; server counted {counted}; "
                        f"the first were suspended at: {where}")
        results = [t.result() for t in tasks]
    refused = [r for r, _ in results if r.status_code == 429]
    admitted = sorted(seconds for r, seconds in results if r.status_code == 200)
    others = [(r.status_code, r.text[:200]) for r, _ in results if r.status_code not in (200, 429)]
    assert others == []
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
               for r in refused)
    assert refused, "32 research questions at once must pass the research bound (16)"
    assert len(admitted) >= 16
    p99 = admitted[min(len(admitted) - 1, int(0.99 * len(admitted)))]
    record_property("admitted", len(admitted))
    record_property("refused_429", len(refused))
    record_property("p99_admitted_s", round(p99, 3))
    print(f"\nadmitted {len(admitted)}, 429 {len(refused)}, p99 of admitted {p99:.2f} s")
    assert httpx.get(f"{tiny_server.base_url}/health").status_code == 200


def test_requests_with_bodies_have_one_bound_over_all_routes() -> None:
    """``max_concurrent_bodies`` applies before any route (0 here: every POST is over it); GETs pass."""
    from starlette.testclient import TestClient

    from mia_engine.config import ServerConfig
    from mia_engine.server.app import build_app

    from .test_openapi import _Engine

    config = ServerConfig(allowed_hosts=["testserver"], admission=AdmissionConfig(max_concurrent_bodies=0))
    client = TestClient(build_app(_Engine(), config))  # type: ignore[arg-type]
    response = client.post("/v1/chat/completions", json={"model": "planner", "messages": []})
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert client.get("/openapi.json").status_code == 200
