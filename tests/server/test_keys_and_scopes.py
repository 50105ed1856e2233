"""Keys of several users (``server.keys_file``) and the scope every route declares, through one real server
started with a keys file of single-purpose keys and small per-client caps: every route refuses a key
without its scope, each key opens what its scopes say, SIGHUP swaps the keys under a stream in flight,
a key is bound by its own cap, loopback clients are bound by default, the memory export holds its slot
while it streams, and the audit lines name the key, never the key itself."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import API_KEY, ADMIN_KEY, SERVING_ONLY, ServerHandle, server_fixture, start_server
from tests.processes import refused_serve

KEYS: dict[str, tuple[str, list[str], int]] = {
    "chatter": ("chatter-key-not-secret-0001", ["chat"], 1),
    "streamer": ("streamer-key-not-secret-0002", ["chat"], 0),
    "researcher": ("researcher-key-not-secret-03", ["agent", "learn"], 0),
    "learner": ("learner-key-not-secret-00004", ["learn"], 0),
    "reader": ("reader-key-not-secret-000005", ["memory-read"], 0),
    "writer": ("writer-key-not-secret-000006", ["memory-write"], 0),
    "operator": ("operator-key-not-secret-0007", ["admin"], 0),
}
"""name: (key, scopes, max_concurrent); every scope alone on some key, so every route has a key without it."""
NEWCOMER = ("newcomer", ("newcomer-key-not-secret-0008", ["chat"], 0))
PER_CLIENT = 2
SEND_BUFFER_BYTES = 16384
PROMPT = [{"role": "user", "content": "hello"}]


def _keys_text(keys: dict[str, tuple[str, list[str], int]]) -> str:
    tables = []
    for name, (key, scopes, cap) in keys.items():
        lines = ["[[key]]", f'name = "{name}"', f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"',
                 f"scopes = {json.dumps(scopes)}", *([f"max_concurrent = {cap}"] if cap else [])]
        tables.append("\n".join(lines) + "\n")
    return "\n".join(tables)


def _write_keys(path: Path, text: str) -> None:
    """Replace the keys file whole (a private sibling renamed over it), as an operator's editor would."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(tmp, path)


def _launch(factory: pytest.TempPathFactory) -> ServerHandle:
    folder = factory.mktemp("keys_server")
    keys_file = folder / "keys.toml"
    _write_keys(keys_file, _keys_text(KEYS))
    return start_server(folder, "tiny", f"--server.keys_file={keys_file}", "--server.access_log=true",
                        f"--server.admission.max_concurrent_per_client={PER_CLIENT}",
                        f"--server.admission.send_buffer_bytes={SEND_BUFFER_BYTES}", *SERVING_ONLY)


keys_server = server_fixture("keys_server", _launch)


def _keys_file(server: ServerHandle) -> Path:
    return server.home.parent / "keys.toml"


def _auth(name: str) -> dict[str, str]:
    key = {"api_key": API_KEY, "admin_api_key": ADMIN_KEY}.get(name) or {**KEYS, NEWCOMER[0]: NEWCOMER[1]}[name][0]
    return {"Authorization": f"Bearer {key}"}


def _operations(server: ServerHandle) -> list[tuple[str, str, list[str]]]:
    """(method, path, scopes) of every route the server's app serves, from its own ``/openapi.json``."""
    document = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    return [(method.upper(), path, operation["x-mia-scopes"])
            for path, item in document["paths"].items() for method, operation in item.items()]


def _url(server: ServerHandle, path: str) -> str:
    values = {"role": "planner", "memory_id": "no-such-memory", "model": "planner"}
    return server.base_url + re.sub(r"\{(\w+)(:\w+)?\}", lambda m: values[m.group(1)], path)


def _call(server: ServerHandle, method: str, path: str, key: str) -> httpx.Response:
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    return httpx.request(method, _url(server, path), headers=_auth(key), timeout=120, **body)


def test_every_route_refuses_a_key_without_its_scope_and_admits_one_with_it(keys_server) -> None:
    operations = _operations(keys_server)
    paths = {path for _, path, _ in operations}
    assert {"/health", "/metrics", "/v1/chat/completions", "/v1/memory/export", "/v1/adapters/{role}/grpo",
            "/v1/load_lora_adapter"} <= paths
    for method, path, scopes in operations:
        assert scopes and set(scopes) <= {"public", "chat", "agent", "learn", "memory-read", "memory-write",
                                          "admin"}, (method, path, scopes)
        if scopes == ["public"]:
            continue
        lacking = next(name for name, (_, granted, _) in KEYS.items() if not set(granted) & set(scopes))
        refused = _call(keys_server, method, path, lacking)
        assert refused.status_code == 403, (method, path, lacking, refused.text)
        error = refused.json()["error"]
        assert error["code"] == "insufficient_scope" and all(repr(s) in error["message"] for s in scopes), error
        holder = next(name for name, (_, granted, cap) in KEYS.items() if set(granted) & set(scopes) and not cap)
        admitted = _call(keys_server, method, path, holder)
        assert admitted.status_code not in (401, 403), (method, path, holder, admitted.text)
    assert httpx.get(f"{keys_server.openai_url}/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{keys_server.openai_url}/models").status_code == 401  # a keyed server: no key, no entry


def test_scopes_that_depend_on_the_body(keys_server) -> None:
    """Model ``mia`` needs ``agent``, a role ``chat``, ``learn: true`` ``learn``; the legacy keys keep theirs."""
    def chat(key: str, **body) -> httpx.Response:
        return httpx.post(f"{keys_server.openai_url}/chat/completions", headers=_auth(key), timeout=120,
                          json={"messages": PROMPT, "max_tokens": 2, **body})

    refused = [(chat("chatter", model="mia"), "model"), (chat("researcher", model="planner"), "model"),
               (chat("api_key", model="mia", learn=True), "learn"),
               (chat("learner", model="mia"), None)]  # the route's own scopes (chat or agent), before the body
    for response, param in refused:
        assert response.status_code == 403, response.text
        assert response.json()["error"]["param"] == param and response.json()["error"]["code"] == "insufficient_scope"
    assert chat("chatter", model="planner").status_code == 200
    assert chat("api_key", model="planner").status_code == 200
    # past every scope check: refused for a raw-only field, after the learn scope was granted
    passed = chat("researcher", model="mia", learn=True, ignore_eos=True)
    assert passed.status_code == 400 and passed.json()["error"]["param"] == "ignore_eos", passed.text
    stats = f"{keys_server.openai_url}/memory/stats"
    assert [httpx.get(stats, headers=_auth(k)).status_code for k in ("api_key", "researcher", "reader", "chatter")] \
        == [200, 200, 200, 403]
    search = f"{keys_server.openai_url}/memory/search"
    assert [httpx.post(search, json={"question": "q"}, headers=_auth(k)).status_code
            for k in ("api_key", "writer", "reader", "admin_api_key")] == [403, 403, 200, 200]


def _reloads(server: ServerHandle, word: str) -> int:
    return server.log_path.read_text(errors="replace").count(word)


def _sighup_and_wait(server: ServerHandle, word: str) -> None:
    before = _reloads(server, word)
    os.kill(server.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while _reloads(server, word) == before:
        assert server.process.poll() is None, f"SIGHUP ended the server:\n{server.log_tail()}"
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.05)


def test_sighup_reloads_the_keys_under_a_stream_in_flight(keys_server) -> None:
    from openai import OpenAI

    keys_file, models = _keys_file(keys_server), f"{keys_server.openai_url}/models"
    client = OpenAI(base_url=keys_server.openai_url, api_key=KEYS["streamer"][0], max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="planner", messages=PROMPT, max_tokens=400, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    try:
        chunks = [next(iter(stream))]
        assert httpx.get(models, headers=_auth("newcomer")).status_code == 401
        _write_keys(keys_file, _keys_text({**{k: v for k, v in KEYS.items() if k != "streamer"},
                                           NEWCOMER[0]: NEWCOMER[1]}))
        _sighup_and_wait(keys_server, "keys: reloaded")
        assert httpx.get(models, headers=_auth("newcomer")).status_code == 200
        assert httpx.get(models, headers=_auth("streamer")).status_code == 401  # removed: no new request
        chunks += list(stream)  # ... but the one in flight runs to its end
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"], finish
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 400
        _write_keys(keys_file, "[[key]]\nname = 'broken'\nsha256 = 'not hex'\nscopes = ['chat']\n")
        _sighup_and_wait(keys_server, "keys not reloaded")
        assert httpx.get(models, headers=_auth("newcomer")).status_code == 200  # the old table stays
        assert "key[0] (broken).sha256: must be the 64 hex digits" in keys_server.log_tail()
    finally:
        stream.close()
        _write_keys(keys_file, _keys_text(KEYS))
        _sighup_and_wait(keys_server, "keys: reloaded")


def _held_body(server: ServerHandle, source: str, key: str) -> socket.socket:
    """A POST from ``source`` whose body never ends: it holds its client slot (taken before the body is
    read) until the test closes it (well before ``body_timeout_s``)."""
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), source_address=(source, 0))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\": ".encode())
    return sock


def _metric(server: ServerHandle, name: str, key: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and s.labels.get("key") == key)


def _wait_for(what: Callable[[], bool], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _chat_from(server: ServerHandle, source: str, key: str, results: list[int]) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=120) as client:
        results.append(client.post(f"{server.openai_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "planner", "messages": PROMPT, "max_tokens": 2}).status_code)


def _queues_behind(server: ServerHandle, blockers: list[socket.socket], source: str, key: str) -> None:
    """A request from ``source`` with ``key`` waits in its client's queue while ``blockers`` hold the slots,
    and is answered once they go; a request of another client meanwhile is not held up."""
    results: list[int] = []
    waiter = threading.Thread(target=_chat_from, args=(server, source, key, results))
    try:
        assert _wait_for(lambda: _metric(server, "mia_admission_running", "server:clients") >= len(blockers))
        waiter.start()
        assert _wait_for(lambda: _metric(server, "mia_admission_queued", "server:clients") >= 1), \
            f"not queued behind its client's {len(blockers)} slot(s): {results}"
        other: list[int] = []
        _chat_from(server, "127.0.0.9", API_KEY, other)
        assert other == [200] and not results
    finally:
        for sock in blockers:
            sock.close()
    waiter.join(120)
    assert results == [200]


def test_a_key_of_the_keys_file_is_bound_by_its_own_cap_from_any_address(keys_server) -> None:
    """``chatter`` (max_concurrent 1) holds its one slot from 127.0.0.2; its next request, from another
    address, waits for it."""
    _queues_behind(keys_server, [_held_body(keys_server, "127.0.0.2", KEYS["chatter"][0])], "127.0.0.3",
                   KEYS["chatter"][0])


def test_loopback_clients_are_bound_per_address_by_default(keys_server) -> None:
    blockers = [_held_body(keys_server, "127.0.0.4", API_KEY) for _ in range(PER_CLIENT)]
    _queues_behind(keys_server, blockers, "127.0.0.4", API_KEY)


def test_the_memory_export_holds_its_slot_until_its_body_is_sent(keys_server) -> None:
    url = keys_server.openai_url
    summary = "1. **search** (" + "x" * 3000 + ")"
    for i in range(60):  # ~300 KB of export: more than the server's send buffer and the client's hold
        add = {"question": f"Question {i} of the export test?", "workflow_summary": summary, "label": "correct"}
        assert httpx.post(f"{url}/memory/add", json=add, headers=_auth("writer"), timeout=60).status_code == 200
    host, port = keys_server.base_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect((host, int(port)))
    try:
        sock.sendall(f"GET /v1/memory/export HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer "
                     f"{KEYS['reader'][0]}\r\n\r\n".encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the stream began; the test reads no more of it
        assert _wait_for(lambda: _metric(keys_server, "mia_admission_running", "route:memory") == 1, 5), \
            "the export's slot was released before its body was sent"
    finally:
        sock.close()
    assert _wait_for(lambda: _metric(keys_server, "mia_admission_running", "route:memory") == 0, 40)


def test_audit_lines_name_the_key_never_the_key_itself(keys_server) -> None:
    url = keys_server.openai_url
    add = {"question": "Who audits?", "workflow_summary": "1. **search** (-> audit)", "label": "correct"}
    assert httpx.post(f"{url}/memory/add", headers=_auth("writer"), timeout=60, json=add).status_code == 200
    assert httpx.delete(f"{url}/memory/no-such-memory", headers=_auth("writer")).status_code == 404
    assert httpx.post(f"{url}/chat/completions", headers=_auth("api_key"), timeout=120,
                      json={"model": "planner", "messages": PROMPT, "max_tokens": 2}).status_code == 200
    assert httpx.get(f"{url}/memory/export", headers=_auth("reader")).status_code == 200
    httpx.post(f"{url}/adapters/planner/grpo", json={"groups": []}, headers=_auth("learner"), timeout=60)
    httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "none"}, headers=_auth("operator"), timeout=60)
    assert httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "none"}, headers=_auth("chatter")
                      ).status_code == 403
    time.sleep(0.5)
    log = keys_server.log_path.read_text(errors="replace")
    audit = [line for line in log.splitlines() if " mia_engine.audit: " in line]
    unload = "POST /v1/unload_lora_adapter (Stop serving a model id loaded as an adapter (vLLM's route))"
    for expected in (r"key 'writer': POST /v1/memory/add \(Store a workflow memory\): 200",
                     r"key 'writer': DELETE /v1/memory/no-such-memory \(Delete a memory\): 404",
                     r"key 'reader': GET /v1/memory/export \(Every record, as JSON lines\): 200",
                     r"key 'learner': POST /v1/adapters/planner/grpo \(One GRPO update from scored completions\): "
                     r"\d{3}\b.*",
                     rf"key 'operator': {re.escape(unload)}: \d{{3}}\b.*",
                     rf"key 'chatter': {re.escape(unload)}: 403 insufficient_scope"):
        assert any(re.search(f"{expected}$", line) for line in audit), (expected, audit[-10:])
    access = [line for line in log.splitlines() if " mia_engine.server.access_log: " in line]
    assert any(' writer "POST /v1/memory/add" 200 ' in line for line in access), access[-10:]
    assert any(' reader "GET /v1/memory/export" 200 ' in line for line in access), access[-10:]
    assert any(' api_key "POST /v1/chat/completions" 200 ' in line for line in access), access[-10:]
    for secret in [key for key, _, _ in KEYS.values()] + [API_KEY, ADMIN_KEY]:
        assert secret not in log
    assert "keys: loaded 7 key(s) from" in log and "chatter, learner, operator, reader, researcher" in log


def test_a_bad_keys_file_is_refused_at_start_with_one_line(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    _write_keys(keys_file, _keys_text(KEYS) + '\n[[key]]\nname = "eve"\nsha256 = "' + "0" * 64
                + '"\nscopes = ["chat", "root"]\n')
    result = refused_serve(tmp_path, f"--server.keys_file={keys_file}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"python -m mia_engine: error: server.keys_file: {keys_file}: key[7] (eve).scopes: unknown scope 'root' "
        "(choose from chat, agent, learn, memory-read, memory-write, admin)"]
    _write_keys(keys_file, _keys_text(KEYS))
    keys_file.chmod(0o620)  # hashes are no secret, but whoever may write the file may add keys
    result = refused_serve(tmp_path, f"--server.keys_file={keys_file}")
    assert result.returncode == 2 and "is open to other users (mode 0620)" in result.stderr, result.stderr


def _app_with_every_route(keys_file: Path):
    """The app ``build_app`` makes with every part (fakes: only the routes and their guards run here)."""
    from mia_engine.config import ServerConfig
    from mia_engine.server.app import AppParts, build_app

    from .test_openapi import _Engine, _Learner

    config = ServerConfig(allowed_hosts=["testserver"], api_key=API_KEY, admin_api_key=ADMIN_KEY,
                          keys_file=str(keys_file))
    return build_app(AppParts(_Engine(), config, learner=_Learner(), adapters=object(),  # type: ignore[arg-type]
                              loras=object(), memory=object(), encoder=lambda: None, agent=object()))


def test_every_route_of_the_app_declares_a_scope_and_refuses_a_key_without_it(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mia_engine.server.openapi import ApiRoute
    from mia_engine.server.security import ROUTE_SCOPES

    _write_keys(tmp_path / "keys.toml", _keys_text(KEYS))
    app = _app_with_every_route(tmp_path / "keys.toml")
    client = TestClient(app)
    assert {"/health", "/v1/models", "/v1/embeddings", "/tokenize", "/v1/adapters/{role}/grpo", "/v1/adapters/{role}",
            "/v1/load_lora_adapter", "/v1/memory/export", "/openapi.json"} <= {route.path for route in app.routes}
    for route in app.routes:
        assert isinstance(route, ApiRoute) and route.scopes and set(route.scopes) <= set(ROUTE_SCOPES), route
        if route.scopes == ("public",):
            continue
        lacking = next(name for name, (_, granted, _) in KEYS.items() if not set(granted) & set(route.scopes))
        path = re.sub(r"\{(\w+)(:\w+)?\}", "x", route.path)
        response = client.request(route.method, path, headers=_auth(lacking),
                                  **({"json": {}} if route.method == "POST" else {}))
        assert response.status_code == 403, (route.method, route.path, response.text)
        assert response.json()["error"]["code"] == "insufficient_scope"


def test_an_app_with_a_route_without_a_scope_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from starlette.responses import Response
    from starlette.routing import Route

    from mia_engine.server import app as app_module
    from mia_engine.server.openapi import ApiRoute

    health_routes = app_module.health_routes

    async def forgotten(request) -> Response:
        return Response("open to anyone")

    monkeypatch.setattr(app_module, "health_routes",
                        lambda *a: [*health_routes(*a), Route("/v1/forgotten", forgotten, methods=["POST"])])
    _write_keys(tmp_path / "keys.toml", _keys_text(KEYS))
    with pytest.raises(ValueError, match=r"routes without a declared scope .*: POST /v1/forgotten$"):
        _app_with_every_route(tmp_path / "keys.toml")
    with pytest.raises(TypeError, match="scope"):
        ApiRoute("/v1/x", forgotten, method="GET", summary="no scope")  # type: ignore[call-arg]


def test_keys_add_writes_a_hashed_entry_to_a_private_file_and_prints_the_key_once(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"

    def add(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mia_engine", "keys", "add", *args, "--file", str(keys_file)],
                              capture_output=True, text=True, timeout=120)

    first = add("alice", "--scopes", "chat,agent", "--max-concurrent", "4")
    second = add("bob", "--scopes", "memory-read")
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    key = first.stdout.strip()
    assert len(key) >= 43 and key not in keys_file.read_text() and "only time the key is shown" in first.stderr
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    entries = tomllib.loads(keys_file.read_text())["key"]
    assert entries[0] == {"name": "alice", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                          "scopes": ["chat", "agent"], "max_concurrent": 4}
    assert entries[1]["name"] == "bob" and entries[1]["scopes"] == ["memory-read"]
    before = keys_file.read_bytes()
    for args, says in ((("alice", "--scopes", "chat"), "key[2].name: 'alice' is also the name of an earlier key"),
                       (("api_key", "--scopes", "chat"), "'api_key' names server.api_key in the logs"),
                       (("carol", "--scopes", "chat,root"), "unknown scope(s) root")):
        refused = add(*args)
        assert refused.returncode == 2 and says in refused.stderr and refused.stdout == "", refused.stderr
    assert keys_file.read_bytes() == before


def _keys_command(keys_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m mia_engine keys ARGS --file KEYS_FILE``, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "mia_engine", "keys", *args, "--file", str(keys_file)],
                          capture_output=True, text=True, timeout=120)


def test_keys_list_shows_names_scopes_and_caps_never_a_hash(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    _write_keys(keys_file, _keys_text(KEYS))
    listed = _keys_command(keys_file, "list")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert listed.stdout.splitlines() == [f"{name} scopes={','.join(scopes)} max_concurrent={cap}"
                                          for name, (_, scopes, cap) in KEYS.items()]
    assert not re.search(r"[0-9a-f]{16}", listed.stdout)  # no hash
    assert not any(key in listed.stdout for key, _, _ in KEYS.values())
    missing = _keys_command(tmp_path / "absent.toml", "list")
    assert missing.returncode == 2 and missing.stdout == "" and len(missing.stderr.splitlines()) == 1, missing.stderr


def test_keys_remove_rewrites_the_file_without_the_entry_and_refuses_an_unknown_name(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    _write_keys(keys_file, "# keys of the team's server\n\n" + _keys_text(KEYS))
    removed = _keys_command(keys_file, "remove", "streamer")
    assert removed.returncode == 0 and removed.stdout == "", removed.stderr
    assert removed.stderr.splitlines() == [f"removed key 'streamer' from {keys_file}; send SIGHUP to a running "
                                           "server to stop accepting it"]
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    text = keys_file.read_text()
    assert text.startswith("# keys of the team's server\n") and "streamer" not in text
    assert [entry["name"] for entry in tomllib.loads(text)["key"]] == [name for name in KEYS if name != "streamer"]
    before = keys_file.read_bytes()
    for name in ("streamer", "nobody"):
        refused = _keys_command(keys_file, "remove", name)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr.splitlines() == [f"python -m mia_engine: error: --file: {keys_file}: no key named "
                                               f"{name!r} (its keys: {', '.join(n for n in KEYS if n != 'streamer')})"]
    assert keys_file.read_bytes() == before


def test_a_key_removed_by_keys_remove_is_refused_after_sighup_and_the_others_still_work(keys_server) -> None:
    keys_file, models = _keys_file(keys_server), f"{keys_server.openai_url}/models"
    stats = f"{keys_server.openai_url}/memory/stats"
    assert httpx.get(models, headers=_auth("streamer")).status_code == 200
    try:
        removed = _keys_command(keys_file, "remove", "streamer")
        assert removed.returncode == 0, removed.stderr
        _sighup_and_wait(keys_server, "keys: reloaded")
        assert httpx.get(models, headers=_auth("streamer")).status_code == 401
        assert [httpx.get(models, headers=_auth(name)).status_code for name in ("chatter", "researcher")] == [200, 200]
        assert httpx.get(stats, headers=_auth("reader")).status_code == 200
    finally:
        _write_keys(keys_file, _keys_text(KEYS))
        _sighup_and_wait(keys_server, "keys: reloaded")
