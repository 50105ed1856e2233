"""The /v1/memory routes on a real uvicorn server (127.0.0.1, free port) over the real service."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import pytest
import pytest_asyncio
import uvicorn
from starlette.applications import Starlette

from mia_engine.memory.embedder import Embedder
from mia_engine.memory.routes import memory_routes
from mia_engine.memory.service import MemoryService

from .factories import memory_config

ADD = {
    "question": "Who painted The Night Watch?",
    "workflow_summary": "1. **search** (painting → Rembrandt)",
    "label": "correct",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest_asyncio.fixture(scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> AsyncIterator[MemoryService]:
    memory = await MemoryService.open(tmp_path_factory.mktemp("routes"), memory_config(), encoder=embedder)
    yield memory
    await memory.close()


@pytest.fixture(scope="module")
def base_url(service: MemoryService) -> Iterator[str]:
    port = _free_port()
    app = Starlette(routes=memory_routes(service))
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
    with httpx.Client(base_url=base_url, timeout=30) as http:
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
    imported = client.post("/v1/memory/import", content=exported.content)
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
    assert "line 2" in _error(client.post("/v1/memory/import", content=body), 400)["message"]


def test_wrong_method_is_not_a_500(client: httpx.Client) -> None:
    assert client.get("/v1/memory/add").status_code == 404  # read as an id that does not exist
    assert client.put("/v1/memory/stats").status_code == 405


async def test_32_concurrent_adds_all_succeed(base_url: str, client: httpx.Client) -> None:
    before = client.get("/v1/memory/stats").json()["num_entries"]
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        responses = await asyncio.gather(
            *(http.post("/v1/memory/add", json={**ADD, "question": f"concurrent question {i}"}) for i in range(32))
        )
    assert [r.status_code for r in responses] == [200] * 32
    assert len({r.json()["id"] for r in responses}) == 32
    assert client.get("/v1/memory/stats").json()["num_entries"] == before + 32
