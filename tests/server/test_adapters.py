"""Adapters under live traffic: publishing a new version (no failure, no restart, new weights served), an
extra adapter served by name (``--roles.NAME.engine/adapter``, what ``--lora-modules`` makes), and vLLM's
``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` adding and removing a model id while serving. The
folders are trusted no further than checked: ``server.adapter_dirs`` must be the user's (or root's) alone, a
folder holding a link is refused, and the engine loads a private copy of what was checked."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from mia_engine.models.lora import write_lora_adapter
from mia_engine.models.tiny import LORA_TARGETS, VOCAB_SIZE, _model_config
from tests.conftest import ServerHandle, start_server, server_fixture

PROMPT = [{"role": "user", "content": "Plan the search for the oldest university."}]
EXTRA = "sql-lora"
"""The extra adapter the module's server is started with, by name, beside the tiny config's roles."""
FLAGGED = {"lm-lora": 78, "json-lora": 79}
"""Extra adapters given with ``--lora-modules`` (``name=path`` and the JSON form), by the seed of their weights."""
LOADED = "runtime-lora"
"""The adapter the tests load and unload by name while the server runs."""
WEIGHTS = "adapter_model.safetensors"


def _extra_adapter(folder: Path, seed: int) -> Path:
    write_lora_adapter(folder, _model_config(VOCAB_SIZE, 0, 1), rank=8, alpha=16, target_modules=LORA_TARGETS,
                       seed=seed, b_std=0.08, base_model_name="mia-tiny")
    return folder


def _launch(factory: pytest.TempPathFactory) -> ServerHandle:
    """A tiny server with extra adapters on the tiny engine: one as dotted role overrides, two with
    ``--lora-modules``; their folders lie outside every adapter folder the HTTP routes may load from (a
    configured path is the operator's, as with ``vllm serve --lora-modules``)."""
    folder = factory.mktemp("adapters_server")
    extra = _extra_adapter(folder / "extra" / EXTRA, 77)
    flagged = {name: _extra_adapter(folder / "extra" / name, seed) for name, seed in FLAGGED.items()}
    as_json = json.dumps({"name": "json-lora", "path": str(flagged["json-lora"]), "base_model_name": "tiny"})
    return start_server(folder, "tiny", f"--roles.{EXTRA}.engine=tiny", f"--roles.{EXTRA}.adapter={extra}",
                        "--lora-modules", f"lm-lora={flagged['lm-lora']}", as_json)


own_server = server_fixture("own_server", _launch)
"""This module's own server (it publishes, loads and unloads adapters), with the extra adapter ``sql-lora``."""


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


def test_a_folder_holding_a_link_is_refused_naming_the_file(own_server, own_openai_client, tmp_path: Path) -> None:
    """An adapter folder under the data dir whose weights are a link to a file elsewhere (another user's, say)
    is refused by both routes (403 ``adapter_file_not_allowed`` naming the file): nothing is loaded."""
    before = _first_token_logprobs(own_openai_client)
    version = next(a for a in _adapters(own_server) if a["role"] == "planner" and a["is_live"])["version"]
    folder = _new_adapter(own_server, seed=16)
    planted = _new_adapter(own_server, seed=17, folder=tmp_path)
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).symlink_to(planted / WEIGHTS)
    message = _assert_error(_publish(own_server, "planner", folder), 403, "path", "adapter_file_not_allowed")
    assert f"{WEIGHTS} is a symbolic link" in message, message
    response = _lora_request(own_server, "load", {"lora_name": "linked-lora", "lora_path": str(folder)})
    assert f"{WEIGHTS} is a symbolic link" in _assert_error(response, 403, "lora_path", "adapter_file_not_allowed")
    assert next(a for a in _adapters(own_server) if a["role"] == "planner" and a["is_live"])["version"] == version
    assert "linked-lora" not in _models(own_server, own_server.admin_key)
    assert _first_token_logprobs(own_openai_client) == before


def test_the_engine_loads_a_private_copy_of_what_was_checked(own_server, own_openai_client) -> None:
    """The folder handed to the engine is a copy in the data dir's staging folder with the bytes the check
    read; swapping the named folder's weights afterwards changes neither the copy nor the answers; the copy
    goes once its version is replaced and drained. Listings show the folder the request named."""
    folder = _new_adapter(own_server, seed=18)
    checked = (folder / WEIGHTS).read_bytes()
    response = _publish(own_server, "planner", folder)
    assert response.status_code == 200, response.text
    published = response.json()
    assert published["path"] == str(folder.resolve())
    live = re.search(rf"adapter planner@v{published['version']} is live \(lora id {published['lora_id']}, "
                     r".*, loaded from its copy (/\S+)\)$", own_server.log_tail(400), re.MULTILINE)
    assert live, own_server.log_tail(40)
    staged = Path(live[1])
    assert staged.parent.parent == (own_server.data_dir / "adapter-staging").resolve()
    assert (staged / WEIGHTS).read_bytes() == checked
    served = _first_token_logprobs(own_openai_client)
    (folder / WEIGHTS).write_bytes((_new_adapter(own_server, seed=19) / WEIGHTS).read_bytes())  # the swap
    assert (staged / WEIGHTS).read_bytes() == checked
    assert _first_token_logprobs(own_openai_client) == served
    assert _publish(own_server, "planner", _new_adapter(own_server, seed=20)).status_code == 200
    for _ in range(50):
        if not staged.exists():
            break
        time.sleep(0.1)
    assert not staged.exists(), "the replaced version's copy was not removed"


@pytest.mark.parametrize("owner, mode", [(os.geteuid(), 0o777), (os.geteuid(), 0o775), (54321, 0o755)])
def test_serve_refuses_adapter_dirs_another_user_controls(tmp_path: Path, owner: int, mode: int) -> None:
    """``server.adapter_dirs`` must be this user's or root's, writable by no one else: else ``serve`` stops at
    once with one line naming the field (no server starts)."""
    if owner != os.geteuid() and os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    folder = tmp_path / "adapters"
    folder.mkdir()
    folder.chmod(mode)
    os.chown(folder, owner, -1)
    result = subprocess.run([sys.executable, "-m", "mia_engine", "serve", "--config", "tiny", "--data-dir",
                             str(tmp_path / "data"), f"--server.adapter_dirs=[{json.dumps(str(folder))}]"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "MIA_HOME": str(tmp_path)})
    says = ("is open to other users" if owner == os.geteuid() else f"belongs to another user (uid {owner})")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"python -m mia_engine: error: server.adapter_dirs: {folder} {says}")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "data").exists(), result.stderr


# ---- adapters by name: served from the config, loaded and unloaded while serving ------------------------------


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _lora_request(server, route: str, body: dict, key: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.openai_url}/{route}_lora_adapter", json=body,
                      headers=_headers(server.admin_key if key is None else key), timeout=60)


def _models(server, key: str) -> dict[str, dict]:
    response = httpx.get(f"{server.openai_url}/models", headers=_headers(key))
    assert response.status_code == 200, response.text
    return {card["id"]: card for card in response.json()["data"]}


def _assert_error(response: httpx.Response, status: int, param: str | None, code: str | None = None) -> str:
    """The OpenAI-style error body; its message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error["message"]


def test_the_cards_have_root_parent_and_max_model_len(own_server) -> None:
    """vLLM's card fields: the base model's folder as its root and no parent; a role's parent is the base model;
    an adapter's folder is its root for the admin scope only (as ``/v1/adapters`` shows it); ``mia`` has the
    Planner engine's context length."""
    as_admin, as_user = _models(own_server, own_server.admin_key), _models(own_server, own_server.api_key)
    base = as_user["tiny"]
    assert base["parent"] is None and base["max_model_len"] == 4096 and base["root"].startswith(str(own_server.home))
    extra_path = str(Path(own_server.log_path.parent, "extra", EXTRA).resolve())
    assert (as_admin[EXTRA]["root"], as_admin[EXTRA]["parent"], as_admin[EXTRA]["max_model_len"]) == \
        (extra_path, "tiny", 4096)
    assert as_user[EXTRA]["root"] is None and as_user[EXTRA]["parent"] == "tiny"
    live = httpx.get(f"{own_server.openai_url}/adapters", headers=_headers(own_server.admin_key)).json()["data"]
    planner_path = next(a["path"] for a in live if a["role"] == "planner" and a["is_live"])
    assert (as_user["planner"]["root"], as_admin["planner"]["root"]) == (None, planner_path)
    assert (as_user["manager"]["root"], as_user["manager"]["parent"]) == (base["root"], "tiny")  # no adapter
    assert (as_user["mia"]["max_model_len"], as_user["mia"]["parent"]) == (4096, None)
    one = httpx.get(f"{own_server.openai_url}/models/{EXTRA}", headers=_headers(own_server.admin_key)).json()
    assert one == as_admin[EXTRA]


@pytest.mark.parametrize("name", [EXTRA, *FLAGGED])
def test_an_extra_adapter_is_served_by_name(own_server, own_openai_client, name: str) -> None:
    """``--roles.sql-lora.engine=tiny --roles.sql-lora.adapter=PATH``, ``--lora-modules lm-lora=PATH`` and its
    JSON form: each its own model id on chat and completions, with its own weights (the base model answers
    otherwise), listed with the tiny engine as its parent."""
    assert _first_token_logprobs(own_openai_client, name) != _first_token_logprobs(own_openai_client, "tiny")
    out = own_openai_client.completions.create(model=name, prompt="The oldest university is", max_tokens=4)
    assert out.model == name and out.usage.completion_tokens >= 1
    card = _models(own_server, own_server.admin_key)[name]
    assert (card["root"], card["parent"]) == (str((own_server.log_path.parent / "extra" / name).resolve()), "tiny")


async def test_load_serve_and_unload_an_adapter_by_name(own_server, own_openai_client,
                                                        own_async_openai_client) -> None:
    """vLLM's routes: a loaded adapter is listed and answers through the ``openai`` client; ``load_inplace``
    publishes a new version; unloading takes the id off at once (404 ``model_not_found``) while a request
    already running on it finishes, and the engine drops the adapter once that request ends."""
    path = _new_adapter(own_server, seed=11)
    response = _lora_request(own_server, "load", {"lora_name": LOADED, "lora_path": str(path)})
    assert response.status_code == 200, response.text
    assert response.text == f"Success: LoRA adapter '{LOADED}' added successfully."
    card = _models(own_server, own_server.admin_key)[LOADED]
    assert (card["root"], card["parent"], card["max_model_len"], card["adapter_version"]) == \
        (str(path.resolve()), "tiny", 4096, 1)
    assert _models(own_server, own_server.api_key)[LOADED]["root"] is None
    loaded = _first_token_logprobs(own_openai_client, LOADED)
    assert loaded != _first_token_logprobs(own_openai_client, "tiny")
    assert own_openai_client.completions.create(model=LOADED, prompt="A", max_tokens=2).model == LOADED

    again = _lora_request(own_server, "load", {"lora_name": LOADED, "lora_path": str(path)})
    assert "already been loaded" in _assert_error(again, 400, "lora_name")
    newer = _new_adapter(own_server, seed=12)
    response = _lora_request(own_server, "load", {"lora_name": LOADED, "lora_path": str(newer), "load_inplace": True})
    assert response.status_code == 200, response.text
    assert _models(own_server, own_server.admin_key)[LOADED]["adapter_version"] == 2
    assert _first_token_logprobs(own_openai_client, LOADED) != loaded

    running = asyncio.create_task(own_async_openai_client.chat.completions.create(
        model=LOADED, messages=PROMPT, max_tokens=600, temperature=1.0, extra_body={"ignore_eos": True}))
    for _ in range(200):
        await asyncio.sleep(0.05)
        if any(a["role"] == LOADED and a["in_flight"] for a in _adapters(own_server)):
            break
    response = await asyncio.to_thread(_lora_request, own_server, "unload", {"lora_name": LOADED})
    assert response.status_code == 200, response.text
    assert response.text == f"Success: LoRA adapter '{LOADED}' removed successfully."
    with pytest.raises(openai.NotFoundError) as gone:
        await asyncio.to_thread(own_openai_client.chat.completions.create, model=LOADED, messages=PROMPT,
                                max_tokens=2)
    assert gone.value.body["code"] == "model_not_found"
    assert LOADED not in _models(own_server, own_server.admin_key)
    one = httpx.get(f"{own_server.openai_url}/models/{LOADED}", headers=_headers(own_server.api_key))
    assert one.status_code == 404
    draining = [a for a in _adapters(own_server) if a["role"] == LOADED]
    assert draining and not draining[0]["is_live"] and draining[0]["in_flight"] == 1, draining
    assert isinstance((await running).choices[0].message.content, str)  # finished on the unloaded adapter
    for _ in range(50):
        if not any(a["role"] == LOADED for a in _adapters(own_server)):
            break
        await asyncio.sleep(0.1)
    assert not any(a["role"] == LOADED for a in _adapters(own_server)), "the unloaded adapter was not removed"
    assert f"adapter {LOADED}@v2 drained and unloaded" in own_server.log_tail(200)
    assert f"LoRA adapter {LOADED} unloaded" in own_server.log_tail(200)
    missing = _lora_request(own_server, "unload", {"lora_name": LOADED})
    assert "cannot be found" in _assert_error(missing, 404, "lora_name", "model_not_found")


def test_load_and_unload_refusals(own_server, own_openai_client, tmp_path: Path) -> None:
    """The key and the folder rules of ``/v1/adapters`` publishing; vLLM's 400 and 404 cases; what the research
    agent uses stays loaded. Every refusal is an OpenAI-style body and changes nothing."""
    before = _first_token_logprobs(own_openai_client)
    path = _new_adapter(own_server, seed=13)
    body = {"lora_name": "refused-lora", "lora_path": str(path)}
    assert _lora_request(own_server, "load", body, key="wrong-key").status_code == 401
    _assert_error(_lora_request(own_server, "load", body, key=own_server.api_key), 403, None, "insufficient_scope")
    outside = _new_adapter(own_server, seed=14, folder=tmp_path)
    _assert_error(_lora_request(own_server, "load", {**body, "lora_path": str(outside)}), 403, "lora_path",
                  "adapter_path_not_allowed")
    missing = own_server.data_dir / "adapters" / "uploads" / "missing"
    _assert_error(_lora_request(own_server, "load", {**body, "lora_path": str(missing)}), 404, "lora_path",
                  "adapter_not_found")
    for name, says in (("tiny", "conflicts with a served base model"), ("planner", "already been loaded"),
                       ("mia", "reserved model id"), ("embedding", "reserved model id"), ("", "must be provided")):
        assert says in _assert_error(_lora_request(own_server, "load", {**body, "lora_name": name}), 400, "lora_name")
    _assert_error(_lora_request(own_server, "load", {**body, "base_model_name": "gpt-9"}), 400, "base_model_name")
    assert "lora_path" in _assert_error(_lora_request(own_server, "load", {"lora_name": "x"}), 400, None)
    for name, says in (("planner", "agent.roles.planner"), ("judge", "agent.roles.judge"), ("tiny", "base model")):
        assert says in _assert_error(_lora_request(own_server, "unload", {"lora_name": name}), 400, "lora_name")
    _assert_error(_lora_request(own_server, "unload", {"lora_name": "no-such-lora"}), 404, "lora_name",
                  "model_not_found")
    assert "refused-lora" not in _models(own_server, own_server.api_key)
    assert _first_token_logprobs(own_openai_client) == before


def test_a_configured_extra_adapter_can_be_unloaded_and_loaded_again(own_server, own_openai_client) -> None:
    """As vLLM unloads a ``--lora-modules`` adapter: the configured extra role goes (404), and loading its name
    again serves it anew (its versions continue their numbering)."""
    response = _lora_request(own_server, "unload", {"lora_name": EXTRA})
    assert response.status_code == 200, response.text
    with pytest.raises(openai.NotFoundError):
        own_openai_client.chat.completions.create(model=EXTRA, messages=PROMPT, max_tokens=2)
    path = _new_adapter(own_server, seed=15)
    body = {"lora_name": EXTRA, "lora_path": str(path), "base_model_name": "tiny"}
    response = _lora_request(own_server, "load", body)
    assert response.status_code == 200, response.text
    assert _models(own_server, own_server.admin_key)[EXTRA]["adapter_version"] == 2
    assert own_openai_client.chat.completions.create(model=EXTRA, messages=PROMPT, max_tokens=2).model == EXTRA
