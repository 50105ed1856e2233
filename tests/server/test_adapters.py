"""Publishing a new adapter version under live traffic: no failure, no restart, new weights served."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import psutil

from mia_engine.models.lora import write_lora_adapter
from mia_engine.models.tiny import LORA_TARGETS

PROMPT = [{"role": "user", "content": "Plan the search for the oldest university."}]


def _first_token_logprobs(client, model: str = "planner") -> list[float]:
    out = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=1, temperature=0,
                                         logprobs=True, top_logprobs=5)
    return [t.logprob for t in out.choices[0].logprobs.content[0].top_logprobs]


def _adapters(server) -> list[dict]:
    response = httpx.get(f"{server.openai_url}/adapters", headers={"Authorization": f"Bearer {server.api_key}"})
    assert response.status_code == 200
    return response.json()["data"]


def _publish(server, role: str, path: Path) -> httpx.Response:
    return httpx.post(f"{server.openai_url}/adapters/{role}", json={"path": str(path)},
                      headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=60)


def _engine_pids(server) -> set[int]:
    return {p.pid for p in psutil.Process(server.process.pid).children(recursive=True)}


def _new_adapter(server, seed: int, folder: Path | None = None) -> Path:
    """A random planner adapter, by default under the server's data dir (publishing loads only from there
    and the other configured adapter folders)."""
    config = json.loads(next(server.home.glob("models/tiny-*/base/config.json")).read_text())
    out = (folder or server.data_dir / "adapters" / "uploads") / f"planner-{seed}"
    write_lora_adapter(out, config, rank=8, alpha=16, target_modules=LORA_TARGETS, seed=seed, b_std=0.08,
                       base_model_name="mia-tiny")
    return out


async def test_publish_while_16_requests_are_in_flight(own_server, own_openai_client,
                                                       own_async_openai_client) -> None:
    pids = _engine_pids(own_server)
    before = _first_token_logprobs(own_openai_client)
    version_before = next(a for a in _adapters(own_server) if a["role"] == "planner" and a["is_live"])

    async def long_request() -> str:
        out = await own_async_openai_client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=300,
                                                                temperature=1.0)
        return out.choices[0].message.content

    tasks = [asyncio.create_task(long_request()) for _ in range(16)]
    for _ in range(200):
        await asyncio.sleep(0.05)
        if sum(a["in_flight"] for a in _adapters(own_server) if a["role"] == "planner") >= 16:
            break
    path = _new_adapter(own_server, seed=4242)
    response = await asyncio.to_thread(_publish, own_server, "planner", path)
    assert response.status_code == 200, response.text
    published = response.json()
    assert published["version"] == version_before["version"] + 1
    assert published["lora_id"] != version_before["lora_id"]
    draining = [a for a in _adapters(own_server) if a["role"] == "planner" and not a["is_live"]]
    assert draining and draining[0]["in_flight"] > 0, "the old version should still serve its requests"

    results = await asyncio.gather(*tasks)
    assert len(results) == 16 and all(isinstance(r, str) for r in results)
    after = _first_token_logprobs(own_openai_client)
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3
    for _ in range(50):
        if all(a["is_live"] for a in _adapters(own_server)):
            break
        await asyncio.sleep(0.1)
    assert all(a["is_live"] for a in _adapters(own_server)), "the drained version was not unloaded"
    assert _engine_pids(own_server) == pids, "the engine was restarted"
    assert own_server.process.poll() is None


def test_publish_rejects_bad_adapters(own_server, own_openai_client, tmp_path: Path) -> None:
    before = _first_token_logprobs(own_openai_client)
    assert _publish(own_server, "planner", own_server.data_dir / "adapters" / "missing").status_code == 400
    bad_rank = _new_adapter(own_server, seed=1)
    config = json.loads((bad_rank / "adapter_config.json").read_text())
    (bad_rank / "adapter_config.json").write_text(json.dumps({**config, "r": 64}))
    response = _publish(own_server, "planner", bad_rank)
    assert response.status_code == 400 and "rank" in response.json()["error"]["message"]
    assert _publish(own_server, "manager", tmp_path).status_code == 404
    assert _first_token_logprobs(own_openai_client) == before


def test_publish_loads_only_from_the_configured_adapter_folders(own_server, own_openai_client,
                                                                tmp_path: Path) -> None:
    """A valid adapter another user left in /tmp, or linked into the data dir, is refused (403 naming
    ``path``) before the folder is read: the Planner keeps its weights and version."""
    before = _first_token_logprobs(own_openai_client)
    version = next(a for a in _adapters(own_server) if a["role"] == "planner" and a["is_live"])["version"]
    outside = _new_adapter(own_server, seed=7, folder=tmp_path)
    link = own_server.data_dir / "adapters" / "uploads" / "linked"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    for path in (outside, link, own_server.data_dir / "adapters" / ".." / outside.name, tmp_path / "missing"):
        response = _publish(own_server, "planner", path)
        assert response.status_code == 403, (path, response.text)
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("path", "adapter_path_not_allowed")
        assert str(own_server.data_dir) not in error["message"]
    assert next(a for a in _adapters(own_server) if a["role"] == "planner" and a["is_live"])["version"] == version
    assert _first_token_logprobs(own_openai_client) == before
