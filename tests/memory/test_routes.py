"""The /v1/memory routes on a real uvicorn server (127.0.0.1, free port) over the real service."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import numpy as np
import pytest
import pytest_asyncio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware

from mia_engine.memory.embedder import Embedder
from mia_engine.config import ServerConfig
from mia_engine.memory.service import MemoryService
from mia_engine.server.memory_api import memory_routes
from mia_engine.server.security import SecurityMiddleware

from tests.processes import free_port

from .factories import memory_config

NDJSON = {"content-type": "application/x-ndjson"}
ADMIN_KEY = "admin-key-of-this-test"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}  # the writes, imports and exports are in the admin scope
ADD = {
    "question": "Who painted The Night Watch?",
    "workflow_summary": "1. **search** (painting → Rembrandt)",
    "label": "correct",
}


@pytest_asyncio.fixture(scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> AsyncIterator[MemoryService]:
    memory = await MemoryService.open(tmp_path_factory.mktemp("routes"), memory_config(), encoder=embedder)
    yield memory
    await memory.close()


@pytest.fixture(scope="module")
def base_url(service: MemoryService) -> Iterator[str]:
    port = free_port()
    app = Starlette(routes=memory_routes(service),
                    middleware=[Middleware(SecurityMiddleware, config=ServerConfig(admin_api_key=ADMIN_KEY))])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="memory-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30, headers=ADMIN) as http:
        yield http


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_add_get_search_delete(client: httpx.Client) -> None:
    added = client.post("/v1/memory/add", json=ADD)
    assert added.status_code == 200 and added.json()["action"] == "inserted"
    memory_id = added.json()["id"]

    got = client.get(f"/v1/memory/{memory_id}").json()
    assert got["question"] == ADD["question"] and got["num_uses"] == 0 and got["object"] == "memory"
    assert "question_embedding" not in got

    found = client.post("/v1/memory/search", json={"question": "Night Watch painter?", "num_negative": 0})
    assert found.status_code == 200
    hit = next(h for h in found.json()["positives"] if h["memory"]["id"] == memory_id)
    assert set(hit) == {"memory", "score", "sim", "sim_norm", "value", "freq"} and hit["sim"] > 0.5
    assert found.json()["negatives"] == [] and found.json()["bucket"] == "text/others"

    deleted = client.delete(f"/v1/memory/{memory_id}")
    assert deleted.json() == {"id": memory_id, "deleted": True, "object": "memory.deleted"}
    assert _error(client.get(f"/v1/memory/{memory_id}"), 404)["type"] == "not_found_error"
    assert _error(client.delete(f"/v1/memory/{memory_id}"), 404)["code"] == "memory_not_found"


def test_export_import_stats(client: httpx.Client) -> None:
    added = [client.post("/v1/memory/add", json={**ADD, "question": f"export question {i}"}) for i in range(3)]
    ids = [response.json()["id"] for response in added]
    exported = client.get("/v1/memory/export")
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-ndjson")
    lines = exported.content.splitlines()
    assert {msgspec.json.decode(line)["id"] for line in lines} >= set(ids)
    for memory_id in ids:
        client.delete(f"/v1/memory/{memory_id}")
    imported = client.post("/v1/memory/import", content=exported.content, headers=NDJSON)
    assert imported.json() == {"num_imported": len(lines)}
    assert client.get("/v1/memory/export").content.splitlines() == lines  # identical, counters and times included
    stats = client.get("/v1/memory/stats").json()
    assert stats["num_entries"] >= 3 and stats["dim"] == 384 and "text/others" in stats["buckets"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/memory/add", b"{not json", None),
        ("/v1/memory/add", b"", None),
        ("/v1/memory/add", msgspec.json.encode({**ADD, "label": 5}), "label"),
        ("/v1/memory/add", msgspec.json.encode({**ADD, "label": "maybe"}), "label"),
        ("/v1/memory/add", msgspec.json.encode({**ADD, "question": ""}), "question"),
        ("/v1/memory/add", msgspec.json.encode({**ADD, "colour": "red"}), None),
        ("/v1/memory/add", msgspec.json.encode({**ADD, "category": "astrology"}), None),
        ("/v1/memory/add", msgspec.json.encode([ADD]), None),
        ("/v1/memory/search", msgspec.json.encode({"question": "q", "num_positive": -1}), "num_positive"),
        ("/v1/memory/search", msgspec.json.encode({"question": 3}), "question"),
        ("/v1/memory/import", b'{"kind": "entry", "id": "x"}\n', None),
        ("/v1/memory/import", b"garbage\n", None),
    ],
)
def test_bad_input_is_a_400_with_an_openai_error_body(
    client: httpx.Client, path: str, body: bytes, param: str | None
) -> None:
    error = _error(client.post(path, content=body, headers={"content-type": "application/json"}), 400)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def test_import_error_names_the_line(client: httpx.Client) -> None:
    body = b"\n".join([client.get("/v1/memory/export").content.splitlines()[0], b'{"kind": "entry"}'])
    assert "line 2" in _error(client.post("/v1/memory/import", content=body, headers=NDJSON), 400)["message"]


def test_an_import_line_with_a_string_that_is_not_utf8_is_a_400_naming_the_line(client: httpx.Client) -> None:
    line = b'{"kind": "meta_plan", "id": "a", "question": "\xc0\xaf", "successful_plan": "s", "failed_plan": "f"}'
    body = b"\n".join([client.get("/v1/memory/export").content.splitlines()[0], line])
    assert "line 2" in _error(client.post("/v1/memory/import", content=body, headers=NDJSON), 400)["message"]


def test_wrong_method_is_not_a_500(client: httpx.Client) -> None:
    assert client.get("/v1/memory/add").status_code == 404  # read as an id that does not exist
    assert client.put("/v1/memory/stats", json={}).status_code == 405


async def test_32_concurrent_adds_all_succeed(base_url: str, client: httpx.Client) -> None:
    before = client.get("/v1/memory/stats").json()["num_entries"]
    async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=ADMIN) as http:
        responses = await asyncio.gather(
            *(http.post("/v1/memory/add", json={**ADD, "question": f"concurrent question {i}"}) for i in range(32))
        )
    assert [r.status_code for r in responses] == [200] * 32
    assert len({r.json()["id"] for r in responses}) == 32
    assert client.get("/v1/memory/stats").json()["num_entries"] == before + 32


def _exported_entry(client: httpx.Client, question: str) -> dict:
    memory_id = client.post("/v1/memory/add", json={**ADD, "question": question}).json()["id"]
    for line in client.get("/v1/memory/export").content.splitlines():
        record = msgspec.json.decode(line)
        if record["id"] == memory_id:
            return {**record, "id": f"{memory_id}-copy"}
    raise AssertionError("the added memory is not in the export")


def _embedding(values: np.ndarray) -> str:
    return base64.b64encode(values.astype("<f4").tobytes()).decode()


@pytest.mark.parametrize("change, message", [
    ({"question_embedding": "nan"}, "non-finite"),
    ({"question_embedding": "scaled"}, "not L2-normalised"),
    ({"num_uses": 1, "num_successes": 2}, "must not exceed num_uses"),
])
def test_import_refuses_records_that_would_poison_a_bucket(client: httpx.Client, change: dict, message: str) -> None:
    record = _exported_entry(client, f"poison {message}")
    key = np.frombuffer(base64.b64decode(record["question_embedding"]), dtype="<f4").copy()
    if change.get("question_embedding") == "nan":
        key[3] = np.nan
        change = {"question_embedding": _embedding(key)}
    elif change.get("question_embedding") == "scaled":
        change = {"question_embedding": _embedding(key * 1.5)}
    before = client.get("/v1/memory/stats").json()["num_entries"]
    body = msgspec.json.encode({**record, **change}) + b"\n"
    assert message in _error(client.post("/v1/memory/import", content=body, headers=NDJSON), 400)["message"]
    assert client.get("/v1/memory/stats").json()["num_entries"] == before
    assert client.post("/v1/memory/search", json={"question": "poison"}).status_code == 200


def test_chunked_body_over_the_cap_is_refused_while_streaming(client: httpx.Client) -> None:
    sent = []

    def chunks():  # no Content-Length: the server must count as it reads, and stop early
        for _ in range(64):
            sent.append(1)
            yield b" " * (1 << 20)

    response = client.post("/v1/memory/add", content=chunks(), headers={"content-type": "application/json"})
    assert _error(response, 413)["code"] == "payload_too_large"
    assert ServerConfig().max_body_bytes < (1 << 20) * 64


def test_cross_site_text_plain_post_is_415(client: httpx.Client) -> None:
    before = client.get("/v1/memory/stats").json()["num_entries"]
    response = client.post("/v1/memory/add", content=msgspec.json.encode(ADD), headers={"content-type": "text/plain"})
    assert _error(response, 415)["code"] == "unsupported_media_type"
    assert client.get("/v1/memory/stats").json()["num_entries"] == before


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/memory/add", "question"),
        ("/v1/memory/add", "workflow_summary"),
        ("/v1/memory/add", "plan"),
        ("/v1/memory/add", "trajectory"),
        ("/v1/memory/add", "caption"),
        ("/v1/memory/search", "question"),
        ("/v1/memory/search", "caption"),
    ],
)
def test_a_text_field_over_its_cap_is_a_400_naming_it(client: httpx.Client, path: str, field: str) -> None:
    """Each memory text field is capped (``memory.text_limits``) before it is embedded or journaled."""
    limits = memory_config().text_limits
    cap = {"question": limits.max_question_chars, "caption": limits.max_caption_chars,
           "workflow_summary": limits.max_summary_chars, "plan": limits.max_plan_chars,
           "trajectory": limits.max_trajectory_chars}[field]
    body = {**(ADD if path.endswith("add") else {"question": ADD["question"]}), field: "x" * (cap + 1)}
    before = client.get("/v1/memory/stats").json()["num_entries"]
    error = _error(client.post(path, json=body), 400)
    assert error["param"] == field and "text_limits.max_" in error["message"]
    assert client.get("/v1/memory/stats").json()["num_entries"] == before
