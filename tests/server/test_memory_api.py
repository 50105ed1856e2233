"""The memory routes mounted on the real server: add, search with score terms, get, delete, stats."""

from __future__ import annotations

import httpx


def _call(server, method: str, path: str, *, headers: dict | None = None, **kwargs) -> httpx.Response:
    """Writes (add, delete) need the admin key; reads work with it too."""
    headers = {"Authorization": f"Bearer {server.admin_key}", **(headers or {})}
    return httpx.request(method, f"{server.openai_url}/memory{path}", headers=headers, timeout=60, **kwargs)


def test_memory_round_trip_on_the_serving_process(tiny_server) -> None:
    added = _call(tiny_server, "POST", "/add", json={
        "question": "Which river flows through Cairo?", "workflow_summary": "1. **search** (river Cairo -> Nile)",
        "label": "correct", "plan": "search the river"})
    assert added.status_code == 200, added.text
    memory_id = added.json()["id"]
    _call(tiny_server, "POST", "/add", json={
        "question": "Which mountain is the highest?", "workflow_summary": "1. **guess** (-> K2)", "label": "incorrect"})

    hits = _call(tiny_server, "POST", "/search", json={"question": "What river runs through Cairo?"})
    assert hits.status_code == 200, hits.text
    body = hits.json()
    top = body["positives"][0]
    assert top["memory"]["id"] == memory_id
    assert {"score", "sim", "sim_norm", "value", "freq"} <= set(top)
    assert body["negatives"] and body["negatives"][0]["memory"]["label"] == "incorrect"

    assert _call(tiny_server, "GET", f"/{memory_id}").json()["question"] == "Which river flows through Cairo?"
    assert _call(tiny_server, "GET", "/stats").json()["num_entries"] >= 2
    assert _call(tiny_server, "DELETE", f"/{memory_id}").status_code == 200
    assert _call(tiny_server, "GET", f"/{memory_id}").status_code == 404


def test_memory_bad_input_is_4xx(tiny_server) -> None:
    response = _call(tiny_server, "POST", "/add", json={"question": "", "workflow_summary": "x", "label": "maybe"})
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert _call(tiny_server, "POST", "/search", content=b"{oops",
                 headers={"Content-Type": "application/json"}).status_code == 400
    assert httpx.get(f"{tiny_server.openai_url}/memory/stats").status_code == 401  # behind --api-key too
