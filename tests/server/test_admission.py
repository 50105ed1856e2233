"""Admission control: requests over a bound wait in a bounded FIFO queue per key; 429 with Retry-After only
when the queue is full or the wait deadline passes; never a hang, never a 5xx."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from mia_engine.config import AdmissionConfig
from mia_engine.server.admission import Admission
from mia_engine.server.errors import TooManyRequests

NUM_CHAT = 512
NUM_RESEARCH = 256


def _config(**fields) -> AdmissionConfig:
    return AdmissionConfig(retry_after_s=3, **fields)


async def _queued(admission: Admission, key: str, limit: int, **kw) -> asyncio.Task:
    """A task waiting in ``key``'s queue (checked: it has not got its slot)."""
    task = asyncio.ensure_future(admission.acquire(key, limit, **kw))
    await asyncio.sleep(0)
    assert not task.done()
    return task


async def test_over_the_limit_waits_and_a_full_queue_refuses_with_retry_after() -> None:
    admission = Admission(_config(max_queued_per_key=1))
    await admission.acquire("model:planner", 1)
    waiting = await _queued(admission, "model:planner", 1)
    with pytest.raises(TooManyRequests) as info:
        await admission.acquire("model:planner", 1, param="model")
    response = info.value.to_response()
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert "max_queued_per_key" in info.value.message
    await admission.acquire("model:executor", 1)  # keys are independent
    admission.release("model:planner")  # the slot passes to the waiter
    await waiting
    assert admission.running("model:planner") == 1 and admission.queued("model:planner") == 0
    for key in ("model:planner", "model:executor"):
        admission.release(key)
    assert admission.keys() == ["model:executor", "model:planner"] and admission.running("model:planner") == 0
    assert admission.stats["model:planner"].num_rejected == {"queue_full": 1}


async def test_waiters_are_admitted_first_come_first_served() -> None:
    admission = Admission(_config())
    await admission.acquire("route:mia", 1)
    order: list[int] = []

    async def request(i: int) -> None:
        await admission.acquire("route:mia", 1)
        order.append(i)

    tasks = [asyncio.ensure_future(request(i)) for i in range(5)]
    await asyncio.sleep(0)
    for _ in range(5):
        admission.release("route:mia")
        late = asyncio.ensure_future(request(99))  # arrives as a slot frees: must not overtake the queue
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        late.cancel()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert admission.running("route:mia") == 1 and admission.queued("route:mia") == 0


async def test_the_wait_deadline_answers_429_and_leaves_the_queue() -> None:
    admission = Admission(_config(max_queue_wait_s=0.05))
    await admission.acquire("route:mia", 1)
    start = time.monotonic()
    with pytest.raises(TooManyRequests) as info:
        await admission.acquire("route:mia", 1)
    assert 0.04 < time.monotonic() - start < 1 and "max_queue_wait_s" in info.value.message
    assert admission.queued("route:mia") == 0 and admission.stats["route:mia"].num_rejected == {"deadline": 1}
    admission.release("route:mia")
    assert admission.keys() == ["route:mia"] and admission.running("route:mia") == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_a_slot_handed_to_it_moves_on() -> None:
    admission = Admission(_config())
    await admission.acquire("route:mia", 1)
    first = await _queued(admission, "route:mia", 1)
    second = await _queued(admission, "route:mia", 1)
    first.cancel()
    await asyncio.sleep(0)
    assert admission.queued("route:mia") == 1
    third = await _queued(admission, "route:mia", 1)
    admission.release("route:mia")  # handed to ``second`` ...
    second.cancel()  # ... which is cancelled before it runs: the slot goes on to ``third``
    await third
    assert second.cancelled() and admission.running("route:mia") == 1 and admission.queued("route:mia") == 0
    admission.release("route:mia")
    assert admission.running("route:mia") == 0  # nothing leaked


async def test_a_client_that_disconnects_while_queued_leaves_the_queue() -> None:
    from starlette.requests import Request

    from mia_engine.server.admission import ClientGone

    gone = asyncio.Event()

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    admission = Admission(_config())
    await admission.acquire("model:planner", 1)
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    waiting = await _queued(admission, "model:planner", 1, request=request)
    gone.set()
    with pytest.raises(ClientGone):
        await waiting
    assert admission.queued("model:planner") == 0
    admission.release("model:planner")
    assert admission.running("model:planner") == 0
    assert admission.stats["model:planner"].num_rejected == {"disconnected": 1}


async def test_queue_depth_wait_and_rejections_are_in_the_metrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from mia_engine.server.metrics import Metrics

    admission = Admission(_config(max_queued_per_key=1))
    metrics = Metrics()
    metrics.watch_admission(admission)
    await admission.acquire("route:mia", 1)
    waiting = await _queued(admission, "route:mia", 1)
    with pytest.raises(TooManyRequests):
        await admission.acquire("route:mia", 1)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert samples[("mia_admission_queued", (("key", "route:mia"),))] == 1
    assert samples[("mia_admission_running", (("key", "route:mia"),))] == 1
    assert samples[("mia_admission_wait_seconds_count", (("key", "route:mia"),))] == 1
    assert samples[("mia_admission_rejected_total", (("key", "route:mia"), ("reason", "queue_full")))] == 1
    admission.release("route:mia")
    await waiting


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


def _metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def _chat_via_openai(client, body: dict) -> tuple[httpx.Response | Exception, float]:
    """A chat request through the real ``openai`` client: its raw HTTP response, or the error it raised."""
    start = time.perf_counter()
    try:
        raw = await client.chat.completions.with_raw_response.create(**body)
        return raw.http_response, time.perf_counter() - start
    except Exception as err:  # noqa: BLE001 - reported by the assertion below
        return err, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.timeout(900)  # may pay the shared server's start (a fixture's setup counts) before its own 580 s
async def test_256_research_and_512_chat_requests_at_once_all_answered(tiny_server, record_property) -> None:
    """The default bounds (16 research, 128 per model) queue the rest: every request answered, none 429."""
    from openai import AsyncOpenAI

    before = httpx.get(f"{tiny_server.base_url}/metrics").text
    limits = httpx.Limits(max_connections=NUM_CHAT + NUM_RESEARCH + 8)
    headers = {"Authorization": f"Bearer {tiny_server.api_key}"}
    chat = [{"model": "planner", "messages": [{"role": "user", "content": f"Question {i}?"}], "max_tokens": 4}
            for i in range(NUM_CHAT)]
    research = [{"model": "mia", "messages": [{"role": "user", "content": f"Which river flows through city {i}?"}],
                 "rollouts": 1} for i in range(NUM_RESEARCH)]
    async with httpx.AsyncClient(base_url=tiny_server.openai_url, headers=headers, timeout=600,
                                 limits=limits) as http, \
            AsyncOpenAI(base_url=tiny_server.openai_url, api_key=tiny_server.api_key, max_retries=0,
                        http_client=httpx.AsyncClient(timeout=600, limits=limits)) as client:
        tasks = [*(asyncio.ensure_future(_timed(http, b)) for b in research),
                 *(asyncio.ensure_future(_chat_via_openai(client, b)) for b in chat)]
        done, pending = await asyncio.wait(tasks, timeout=float(os.environ.get("MIA_TEST_LOAD_WAIT_S", 580)))
        if pending:  # say which never came back, and what the server counted, instead of a bare timeout
            waiting = [("mia" if i < NUM_RESEARCH else "planner", i) for i, t in enumerate(tasks) if t in pending]
            counted = [line for line in httpx.get(f"{tiny_server.base_url}/metrics").text.splitlines()
                       if line.startswith(("mia_requests_total", "mia_admission_"))]
            where = [_suspended_at(t) for t in tasks if t in pending][:3]
            for task in pending:
                task.cancel()
            pytest.fail(f"{len(pending)} requests never answered: {waiting[:20]}; server counted {counted}; "
                        f"the first were suspended at: {where}")
        results = [t.result() for t in tasks]
    failed = [(r.status_code, r.text[:200]) if isinstance(r, httpx.Response) else repr(r)[:200]
              for r, _ in results if not isinstance(r, httpx.Response) or r.status_code != 200]
    assert failed == [], f"{len(failed)} of {len(results)} not answered 200"
    seconds = sorted(s for _, s in results)
    p99 = seconds[int(0.99 * (len(seconds) - 1))]
    record_property("p99_s", round(p99, 3))
    print(f"\n{len(results)} answered 200, p99 {p99:.2f} s, slowest {seconds[-1]:.2f} s")
    scrape = httpx.get(f"{tiny_server.base_url}/metrics").text
    def grew(name: str, **labels: str) -> float:
        return _metric(scrape, name, **labels) - _metric(before, name, **labels)

    assert grew("mia_admission_wait_seconds_count", key="route:mia") == NUM_RESEARCH
    assert grew("mia_admission_wait_seconds_sum", key="route:mia") > 0  # the research bound did queue
    assert grew("mia_admission_rejected_total") == 0
    assert httpx.get(f"{tiny_server.base_url}/health").status_code == 200


def test_requests_with_bodies_have_one_bound_over_all_routes() -> None:
    """``max_concurrent_bodies`` applies before any route (0 here: every POST waits in its queue until the
    deadline, then 429); GETs pass."""
    from starlette.testclient import TestClient

    from mia_engine.config import ServerConfig
    from mia_engine.server.app import AppParts, build_app

    from .test_openapi import _Engine

    admission = AdmissionConfig(max_queue_wait_s=0.01)
    msgspec.structs.force_setattr(admission, "max_concurrent_bodies", 0)  # no config allows 0: forced here
    config = ServerConfig(allowed_hosts=["testserver"], admission=admission)
    client = TestClient(build_app(AppParts(_Engine(), config)))  # type: ignore[arg-type]
    response = client.post("/v1/chat/completions", json={"model": "planner", "messages": []})
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert client.get("/openapi.json").status_code == 200


@pytest.mark.slow
async def test_with_8_queued_per_key_the_overflow_gets_429_and_the_server_stays_healthy(public_server) -> None:
    """``public_server``: 2 running and 8 queued per key; 16 research and 20 chat requests at once."""
    from openai import OpenAI

    before = httpx.get(f"{public_server.base_url}/metrics", headers=_auth(public_server)).text
    research = [{"model": "mia", "messages": [{"role": "user", "content": f"Which river flows through city {i}?"}],
                 "rollouts": 1} for i in range(16)]
    chat = [{"model": "planner", "messages": [{"role": "user", "content": f"Question {i}?"}], "max_tokens": 4}
            for i in range(20)]
    async with httpx.AsyncClient(base_url=public_server.openai_url, headers=_auth(public_server), timeout=300,
                                 limits=httpx.Limits(max_connections=64)) as http:
        results = await asyncio.gather(*(_timed(http, b) for b in [*research, *chat]))
    statuses = [r.status_code for r, _ in results]
    refused = [r for r, _ in results if r.status_code == 429]
    assert set(statuses) <= {200, 429}, [(r.status_code, r.text[:200]) for r, _ in results]
    assert statuses[:16].count(200) >= 10 and statuses[:16].count(429) >= 1  # 2 running + 8 queued; 6 over
    assert statuses[16:].count(200) >= 10
    for response in refused:
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and "max_queued_per_key" in error["message"]
    scrape = httpx.get(f"{public_server.base_url}/metrics", headers=_auth(public_server)).text
    rejected = (_metric(scrape, "mia_admission_rejected_total", reason="queue_full")
                - _metric(before, "mia_admission_rejected_total", reason="queue_full"))
    assert rejected == len(refused)
    assert _metric(scrape, "mia_admission_queued") == 0
    assert httpx.get(f"{public_server.base_url}/health").status_code == 200
    client = OpenAI(base_url=public_server.openai_url, api_key=public_server.api_key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(model="planner", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4)
    assert answer.choices[0].message.content is not None


def _auth(server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}"}


@pytest.mark.slow
async def test_a_client_that_gives_up_while_queued_leaves_the_queue(public_server) -> None:
    """Both research slots of ``public_server`` busy; a third question's client times out while queued: the
    server drops it from the queue (counted as ``disconnected``) and never runs it."""
    url, auth = public_server.base_url, _auth(public_server)
    question = {"model": "mia", "messages": [{"role": "user", "content": "Who founded the oldest university?"}],
                "rollouts": 4}
    before = httpx.get(f"{url}/metrics", headers=auth).text
    async with httpx.AsyncClient(base_url=public_server.openai_url, headers=auth, timeout=300) as http:
        busy = [asyncio.ensure_future(http.post("/chat/completions", json=question)) for _ in range(2)]
        for _ in range(100):  # until both hold their slot
            if _metric(httpx.get(f"{url}/metrics", headers=auth).text, "mia_admission_running", key="route:mia") == 2:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/chat/completions", json=question, timeout=0.5)
        for _ in range(100):
            scrape = httpx.get(f"{url}/metrics", headers=auth).text
            if _metric(scrape, "mia_admission_rejected_total", key="route:mia", reason="disconnected") > \
                    _metric(before, "mia_admission_rejected_total", key="route:mia", reason="disconnected"):
                break
            await asyncio.sleep(0.05)
        assert _metric(scrape, "mia_admission_rejected_total", key="route:mia", reason="disconnected") == \
            _metric(before, "mia_admission_rejected_total", key="route:mia", reason="disconnected") + 1
        assert _metric(scrape, "mia_admission_queued", key="route:mia") == 0
        assert all(not task.done() for task in busy), "the research questions finished too soon for this test"
        assert [r.status_code for r in await asyncio.gather(*busy)] == [200, 200]
    scrape = httpx.get(f"{url}/metrics", headers=auth).text
    assert _metric(scrape, "mia_admission_wait_seconds_count", key="route:mia") == \
        _metric(before, "mia_admission_wait_seconds_count", key="route:mia") + 2  # the third never got a slot
