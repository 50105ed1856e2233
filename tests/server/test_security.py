"""Safe by default: Host check, JSON-only bodies, keys from the environment or a file, the admin scope,
a refused non-loopback bind, and unauthenticated endpoints that leak nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mia_engine.cli import parse_config
from mia_engine.config import ConfigError

PROMPT = [{"role": "user", "content": "hello"}]
ADD = {"question": "Who wrote Hamlet?", "workflow_summary": "1. **search** (-> Shakespeare)", "label": "correct"}


def _headers(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def _stats(server) -> int:
    return httpx.get(f"{server.openai_url}/memory/stats", headers=_headers(server.api_key)).json()["num_entries"]


def test_cross_site_text_plain_post_is_refused_with_415(tiny_server) -> None:
    """What a page on another site can send without a preflight: a "simple" text/plain or form POST."""
    before = _stats(tiny_server)
    body = b'{"question": "x", "workflow_summary": "y", "label": "correct"}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        headers = _headers(tiny_server.admin_key, **({"Content-Type": content_type} if content_type else {}))
        response = httpx.post(f"{tiny_server.openai_url}/memory/add", content=body, headers=headers)
        assert response.status_code == 415, (content_type, response.text)
        assert response.json()["error"]["code"] == "unsupported_media_type"
    chat = httpx.post(f"{tiny_server.openai_url}/chat/completions", content=b'{"model": "planner", "messages": []}',
                      headers=_headers(tiny_server.api_key, **{"Content-Type": "text/plain;charset=UTF-8"}))
    assert chat.status_code == 415
    assert _stats(tiny_server) == before


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "10.0.0.1"])
def test_wrong_host_header_is_refused(tiny_server, host: str) -> None:
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 sends its own Host."""
    for method, path in (("GET", "/v1/memory/export"), ("GET", "/v1/models"), ("GET", "/health")):
        response = httpx.request(method, tiny_server.base_url + path, headers=_headers(tiny_server.admin_key,
                                                                                         Host=host))
        assert response.status_code == 400, (host, path, response.text)
        assert response.json()["error"]["code"] == "invalid_host"
    port = tiny_server.base_url.rsplit(":", 1)[1]
    for good in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert httpx.get(tiny_server.base_url + "/health", headers={"Host": good}).status_code == 200


def test_admin_scope_is_separate_from_the_api_key(tiny_server) -> None:
    user, admin = tiny_server.api_key, tiny_server.admin_key
    before = _stats(tiny_server)
    url = tiny_server.openai_url
    refused = [
        httpx.post(f"{url}/memory/add", json=ADD, headers=_headers(user)),
        httpx.post(f"{url}/memory/import", json=ADD, headers=_headers(user)),
        httpx.get(f"{url}/memory/export", headers=_headers(user)),
        httpx.delete(f"{url}/memory/some-id", headers=_headers(user)),
        httpx.post(f"{url}/adapters/planner", json={"path": "/etc"}, headers=_headers(user)),
        httpx.post(f"{url}/adapters/planner/grpo", json={"groups": []}, headers=_headers(user)),
        httpx.post(f"{url}/adapters/planner/rollback", json={}, headers=_headers(user)),
        httpx.post(f"{url}/chat/completions", headers=_headers(user),
                   json={"model": "mia", "messages": PROMPT, "learn": True}),
    ]
    for response in refused:
        assert response.status_code == 403, (response.request.url, response.text)
        assert response.json()["error"]["code"] == "admin_key_required"
    assert httpx.post(f"{url}/memory/add", json=ADD, headers=_headers("wrong")).status_code == 401
    assert _stats(tiny_server) == before
    # reads stay open to the API key; the admin key opens everything
    assert httpx.post(f"{url}/memory/search", json={"question": "q"}, headers=_headers(user)).status_code == 200
    assert httpx.get(f"{url}/memory/export", headers=_headers(admin)).status_code == 200
    assert httpx.get(f"{url}/models", headers=_headers(admin)).status_code == 200


def test_unauthenticated_health_and_metrics_show_no_paths_or_errors(tiny_server) -> None:
    secrets = [str(tiny_server.data_dir), str(tiny_server.home), "Traceback", "Error:"]
    texts = [r.text for r in tiny_server.health_before_ready]
    texts += [httpx.get(tiny_server.base_url + p).text for p in ("/health", "/metrics", "/openapi.json")]
    for text in texts:
        assert not any(secret in text for secret in secrets), text[:500]
    for response in tiny_server.health_before_ready:
        assert response.status_code == 503, response.text
        for part in response.json()["error"]["message"].split("; "):  # each waiting component, its progress at most
            assert re.fullmatch(r"\w+ is not ready( \(building the search index: \d+/\d+ passages .*\))?",
                                part) or part == "agent is not ready (preparing the search index)", part


def test_non_loopback_bind_without_a_key_is_refused(tmp_path: Path) -> None:
    """Refused before anything binds: one line on stderr that says how to fix it, exit status 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("MIA_API_KEY", "MIA_ADMIN_API_KEY")}
    result = subprocess.run([sys.executable, "-m", "mia_engine", "serve", "--config", "tiny", "--host", "0.0.0.0",
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m mia_engine: error: server.host:")
    assert "MIA_API_KEY" in lines[0] and "allow_unauthenticated_bind" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing started


def test_keys_from_the_environment_or_a_file(tmp_path: Path) -> None:
    argv = ["serve", "--config", "tiny", "--host", "0.0.0.0"]
    with pytest.raises(ConfigError, match="server.host"):
        parse_config(argv, environ={})
    _, config = parse_config(argv, environ={"MIA_API_KEY": "from-env", "MIA_ADMIN_API_KEY": "admin-env"})
    assert (config.server.api_key, config.server.admin_api_key) == ("from-env", "admin-env")
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    key_file.chmod(0o600)
    _, config = parse_config([*argv, "--api-key-file", str(key_file)], environ={"MIA_API_KEY": "from-env"})
    assert config.server.api_key == "from-file"
    with pytest.raises(ConfigError, match="api_key_file"):
        parse_config([*argv, "--api-key-file", str(tmp_path / "missing")], environ={})
    _, config = parse_config([*argv, "--server.allow_unauthenticated_bind=true"], environ={})
    assert config.server.api_key == "" and config.server.allow_unauthenticated_bind


def _public_ip() -> str | None:
    """This machine's non-loopback IPv4 address (the route's source address; no packet is sent), if any."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture(scope="module")
def by_ip(public_server) -> tuple[str, dict[str, str]]:
    """The keyed 0.0.0.0 server as a remote client reaches it: its URL by this machine's IP when it has one
    (the Host header is then that IP), else its loopback URL with a foreign ``Host`` header."""
    port = public_server.base_url.rsplit(":", 1)[1]
    address = _public_ip()
    if address is not None:
        return f"http://{address}:{port}", {}
    return public_server.base_url, {"Host": f"203.0.113.7:{port}"}


def test_a_keyed_public_server_answers_any_host(public_server, by_ip) -> None:
    """A keyed 0.0.0.0 server (as configs/8xgpu.toml deploys) answers clients and probes that use the box's
    IP or DNS name; the key keeps the rest out and keeps ``/metrics`` closed."""
    from openai import OpenAI

    url, host = by_ip
    key = _headers(public_server.api_key)
    assert httpx.get(f"{url}/health", headers=host).status_code == 200  # load-balancer probe, no key
    assert httpx.get(f"{url}/metrics", headers=host).status_code == 401
    metrics = httpx.get(f"{url}/metrics", headers={**host, **key})
    assert metrics.status_code == 200 and "mia_admission_" in metrics.text
    assert httpx.get(f"{url}/v1/models", headers={**host, **_headers("wrong")}).status_code == 401
    body = {"model": "planner", "messages": PROMPT, "max_tokens": 4}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers={**host, **key}, timeout=120)
    assert response.status_code == 200, response.text
    client = OpenAI(base_url=f"{url}/v1", api_key=public_server.api_key, default_headers=host, max_retries=0,
                    timeout=120)
    assert client.chat.completions.create(**body).choices[0].message.content is not None


@pytest.mark.parametrize("host", ["192.0.2.2:8000", "evil.example"])
def test_a_loopback_server_without_a_key_refuses_a_foreign_host(host: str) -> None:
    from starlette.testclient import TestClient

    from mia_engine.config import ServerConfig
    from mia_engine.server.app import build_app

    from .test_openapi import _Engine

    client = TestClient(build_app(_Engine(), ServerConfig()))  # type: ignore[arg-type]
    response = client.get("/health", headers={"Host": host})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_host"
    assert client.get("/health", headers={"Host": "127.0.0.1:8000"}).status_code != 400


def test_which_hosts_each_bind_accepts() -> None:
    from mia_engine.config import ServerConfig
    from mia_engine.server.security import allowed_host_names

    assert allowed_host_names(ServerConfig(host="0.0.0.0", api_key="k")) == {"*"}  # the key protects it
    assert "*" not in allowed_host_names(ServerConfig(host="127.0.0.1", api_key="k"))  # loopback: guard kept
    assert "*" not in allowed_host_names(ServerConfig(host="0.0.0.0", allow_unauthenticated_bind=True))
    assert allowed_host_names(ServerConfig(host="0.0.0.0", api_key="k", allowed_hosts=["mia.example"])) \
        == {"mia.example"}
