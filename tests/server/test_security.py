"""Safe by default: Host check, JSON-only bodies, keys from the environment or a file, the admin scope
(with a generated admin key where none is given), key hygiene, a refused non-loopback bind, and
unauthenticated endpoints that leak nothing."""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from mia_engine import cli
from mia_engine.base.keys import KeyFileError, admin_key, read_key_file
from mia_engine.cli import parse_config
from mia_engine.config import ConfigError
from tests.conftest import SERVING_ONLY, launch_tiny, server_fixture
from tests.processes import refused_serve

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
        assert response.json()["error"]["code"] == "insufficient_scope"
    assert httpx.post(f"{url}/memory/add", json=ADD, headers=_headers("wrong")).status_code == 401
    assert _stats(tiny_server) == before
    # stats stay open to the API key; stored questions (search, get) are the admin scope's, which opens everything
    assert httpx.get(f"{url}/memory/stats", headers=_headers(user)).status_code == 200
    assert httpx.post(f"{url}/memory/search", json={"question": "q"}, headers=_headers(user)).status_code == 403
    assert httpx.post(f"{url}/memory/search", json={"question": "q"}, headers=_headers(admin)).status_code == 200
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
            assert re.fullmatch(r"\w+ is not ready( \((building the search index: \d+/\d+ passages .*"
                                r"|engine [\w-]+ is warming up)\))?", part) \
                or part == "agent is not ready (preparing the search index)", part


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
    _, config = parse_config(argv, environ={"MIA_API_KEY": "api-key-from-env", "MIA_ADMIN_API_KEY": "admin-key-from-env"})
    assert (config.server.api_key, config.server.admin_api_key) == ("api-key-from-env", "admin-key-from-env")
    key_file = tmp_path / "key"
    key_file.write_text("api-key-from-a-file\n")
    key_file.chmod(0o600)
    _, config = parse_config([*argv, "--api-key-file", str(key_file)], environ={"MIA_API_KEY": "api-key-from-env"})
    assert config.server.api_key == "api-key-from-a-file"
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
    assert httpx.get(f"{url}/openapi.json", headers=host).status_code == 401  # how to drive it: clients only
    assert httpx.get(f"{url}/openapi.json", headers={**host, **key}).json()["openapi"]
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
    from mia_engine.server.app import AppParts, build_app

    from .test_openapi import _Engine

    client = TestClient(build_app(AppParts(_Engine(), ServerConfig())))  # type: ignore[arg-type]
    response = client.get("/health", headers={"Host": host})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_host"
    assert client.get("/health", headers={"Host": "127.0.0.1:8000"}).status_code != 400


def test_without_an_admin_key_no_request_is_in_the_admin_scope() -> None:
    """The app itself grants the admin scope only to the admin key, with no key configured too (``serve``
    generates one; an app built without one has no admin)."""
    from starlette.testclient import TestClient

    from mia_engine.config import ServerConfig
    from mia_engine.server.app import AppParts, build_app

    from .test_openapi import GROUP, _Engine, _Learner

    config = ServerConfig(allowed_hosts=["testserver"])
    client = TestClient(build_app(AppParts(_Engine(), config, learner=_Learner())))  # type: ignore[arg-type]
    for headers in ({}, _headers("any-key-at-all-0123")):
        response = client.post("/v1/adapters/planner/grpo", json={"groups": [GROUP]}, headers=headers)
        assert response.status_code == 403 and response.json()["error"]["code"] == "insufficient_scope"
    assert client.get("/v1/models").status_code == 200  # no API key set: the rest stays open on loopback


def test_which_hosts_each_bind_accepts() -> None:
    from mia_engine.config import ServerConfig
    from mia_engine.server.security import allowed_host_names

    assert allowed_host_names(ServerConfig(host="0.0.0.0", api_key="k")) == {"*"}  # the key protects it
    assert "*" not in allowed_host_names(ServerConfig(host="127.0.0.1", api_key="k"))  # loopback: guard kept
    assert "*" not in allowed_host_names(ServerConfig(host="0.0.0.0", allow_unauthenticated_bind=True))
    assert allowed_host_names(ServerConfig(host="0.0.0.0", api_key="k", allowed_hosts=["mia.example"])) \
        == {"mia.example"}


keyless_server = server_fixture("keyless_server", launch_tiny("keyless_server", *SERVING_ONLY, api_key="",
                                                               admin_key=""))
"""A loopback server started with no key at all, as a user starts one on a shared GPU box."""


def _admin_requests(url: str, headers: dict[str, str]) -> list[httpx.Response]:
    return [
        httpx.post(f"{url}/adapters/planner", json={"path": "/tmp/x"}, headers=headers),
        httpx.post(f"{url}/adapters/planner/grpo", json={"groups": []}, headers=headers),
        httpx.post(f"{url}/adapters/planner/rollback", json={}, headers=headers),
        httpx.post(f"{url}/memory/add", json=ADD, headers=headers),
        httpx.post(f"{url}/memory/import", json=ADD, headers=headers),
        httpx.get(f"{url}/memory/export", headers=headers),
        httpx.delete(f"{url}/memory/some-id", headers=headers),
        httpx.post(f"{url}/chat/completions", json={"model": "mia", "messages": PROMPT, "learn": True},
                   headers=headers),
    ]


def test_with_no_keys_the_admin_routes_need_the_generated_admin_key(keyless_server) -> None:
    """Another user of the machine reaches 127.0.0.1 too: without keys configured, the server generates an
    admin key into a file only this user can read, says where in one log line, and the admin routes
    (adapters, learning, memory writes and exports) need it; plain chat still needs no key on loopback."""
    key_file = keyless_server.data_dir / "admin_api_key"
    info = key_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    key = keyless_server.generated_admin_key()
    log = keyless_server.log_path.read_text()
    assert [line for line in log.splitlines() if str(key_file) in line][0].count("admin key generated in") == 1
    assert len(key) >= 16 and key not in log
    url = keyless_server.openai_url
    for headers in ({}, _headers("not-the-admin-key-0123")):
        for response in _admin_requests(url, headers):
            assert response.status_code == 403, (response.request.url, response.text)
            assert response.json()["error"]["code"] == "insufficient_scope"
    chat = httpx.post(f"{url}/chat/completions", json={"model": "planner", "messages": PROMPT, "max_tokens": 2},
                      timeout=120)
    assert chat.status_code == 200, chat.text
    assert httpx.get(f"{url}/memory/export", headers=_headers(key)).status_code == 200


def test_the_generated_admin_key_is_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "data" / "admin_api_key"
    key, created = admin_key(path)
    assert created and len(key) >= 16 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin_key(path) == (key, False)  # a restart keeps the key clients were given
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary file left
    path.chmod(0o640)
    with pytest.raises(KeyFileError, match=f"chmod 600 {path}"):
        admin_key(path)
    path.unlink()
    other = tmp_path / "planted"
    other.write_text("a-key-someone-else-chose\n")
    other.chmod(0o600)
    path.symlink_to(other)  # never followed: whoever can write the folder would choose the key
    with pytest.raises(KeyFileError, match="server.admin_api_key"):
        admin_key(path)


def test_key_files_open_to_other_users_are_refused(tmp_path: Path) -> None:
    argv = ["serve", "--config", "tiny", "--host", "0.0.0.0"]
    key_file = tmp_path / "key"
    key_file.write_text("api-key-from-a-file\n")
    refused = (0o644, 0o604, 0o660) if os.geteuid() == 0 else (0o644, 0o640, 0o604)  # root's may be 0640
    for mode in refused:
        key_file.chmod(mode)
        with pytest.raises(ConfigError, match=rf"server.api_key_file: .* run: chmod 600 {key_file}"):
            parse_config([*argv, "--api-key-file", str(key_file)], environ={})
    key_file.chmod(0o400)
    if os.geteuid() == 0:  # only root can give a file to another user here
        os.chown(key_file, 4242, -1)
        with pytest.raises(ConfigError, match="server.api_key_file: .* belongs to another user"):
            parse_config([*argv, "--api-key-file", str(key_file)], environ={})
        os.chown(key_file, 0, -1)
    link = tmp_path / "mounted-secret"
    link.symlink_to(key_file)  # a mounted secret is often a link: its target is checked
    assert parse_config([*argv, "--api-key-file", str(link)], environ={})[1].server.api_key == "api-key-from-a-file"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file root's and reading it as another user needs root")
def test_a_kubernetes_secret_mount_is_read_by_a_non_root_server() -> None:
    """Kubernetes mounts a secret as root's files behind ``..data`` links, group-owned by the pod's
    ``fsGroup`` with ``defaultMode``; the server runs as another uid in that group. ``defaultMode: 0440``
    is accepted (only root and the group can read it), the default 0644 is still refused."""
    uid, gid = 4242, 4343
    mount = Path(tempfile.mkdtemp(prefix="mia-k8s-secret-"))  # not tmp_path: its parents are closed to the pod's uid
    try:
        mount.chmod(0o755)
        version = mount / "..2026_11_27_09_00_00.000000001"
        version.mkdir(mode=0o755)
        (version / "api-key").write_text("a-key-from-a-kubernetes-secret\n")
        (mount / "..data").symlink_to(version.name)
        (mount / "api-key").symlink_to("..data/api-key")
        os.chown(version / "api-key", 0, gid)

        def read_as_the_pod(mode: int) -> str:
            """``read_key_file`` in a forked child that dropped to the pod's uid and group (the
            interpreter itself lives where that uid cannot exec it)."""
            (version / "api-key").chmod(mode)
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: only these calls, then _exit
                try:
                    os.setgroups([gid]), os.setgid(gid), os.setuid(uid)
                    try:
                        said = read_key_file("server.api_key_file", mount / "api-key")
                    except KeyFileError as err:
                        said = str(err)
                    os.write(write_end, said.encode())
                finally:
                    os._exit(0)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as pipe:
                said = pipe.read().decode()
            os.waitpid(pid, 0)
            return said

        assert read_as_the_pod(0o440) == "a-key-from-a-kubernetes-secret"
        assert read_as_the_pod(0o640) == "a-key-from-a-kubernetes-secret"
        for mode in (0o644, 0o660, 0o444):  # others read it, or the group may change it
            assert read_as_the_pod(mode).startswith(f"server.api_key_file: {mount / 'api-key'} is open to other users "
                                                    f"(mode {mode:04o}); run: chmod 640 ")
        assert "defaultMode 0440 with fsGroup" in read_as_the_pod(0o644)
        os.chown(version / "api-key", 4444, gid)  # a third user's file stays refused
        assert "belongs to another user (uid 4444)" in read_as_the_pod(0o440)
    finally:
        shutil.rmtree(mount)


def test_short_keys_beyond_loopback_and_an_admin_key_equal_to_the_api_key_are_refused(tmp_path: Path) -> None:
    """A short key (vLLM's docs use ``--api-key token-abc123``) is a warning on loopback and refused on a bind
    that other machines reach."""
    argv = ["serve", "--config", "tiny"]
    args, _ = parse_config(argv, environ={"MIA_API_KEY": "test-key"})
    assert args.key_warnings == ["server.api_key: 8 characters, accepted on loopback only; use at least 16 (python "
                                 "-c 'import secrets; print(secrets.token_urlsafe(32))')"]
    exposed = [*argv, "--host", "0.0.0.0"]
    with pytest.raises(ConfigError, match="^server.api_key: 8 characters, on 0.0.0.0, which other machines reach"):
        parse_config(exposed, environ={"MIA_API_KEY": "test-key"})
    with pytest.raises(ConfigError, match="^server.admin_api_key: 5 characters, on 0.0.0.0"):
        parse_config(exposed, environ={"MIA_API_KEY": "a-long-enough-api-key", "MIA_ADMIN_API_KEY": "admin"})
    same = "the-same-key-for-both-scopes"
    with pytest.raises(ConfigError, match="^server.admin_api_key: equals server.api_key"):
        parse_config(argv, environ={"MIA_API_KEY": same, "MIA_ADMIN_API_KEY": same})
    result = refused_serve(tmp_path, f"--server.api_key={same}", f"--server.admin_api_key={same}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "python -m mia_engine: error: server.admin_api_key: equals server.api_key, which would make every API "
        "client an admin; use a different key"]


def test_keys_given_on_the_command_line_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """A command line shows in ``ps`` to every user of the machine."""
    args, config = parse_config(["serve", "--config", "tiny", "--server.api_key=api-key-on-the-command-line",
                                 "--server.admin_api_key", "admin-key-on-the-command-line"], environ={})
    with caplog.at_level(logging.WARNING, logger=cli.PROG):
        cli._warn_about_exposure(args, config)
    assert "--server.api_key is visible to every user of this machine (ps); use $MIA_API_KEY" in caplog.text
    assert "--server.admin_api_key is visible to every user of this machine (ps); use $MIA_ADMIN_API_KEY" \
        in caplog.text
    assert "api-key-on-the-command-line" not in caplog.text
    caplog.clear()
    args, config = parse_config(["serve", "--config", "tiny"],
                                environ={"MIA_ADMIN_API_KEY": "admin-key-from-the-environment"})
    with caplog.at_level(logging.WARNING, logger=cli.PROG):
        cli._warn_about_exposure(args, config)
    assert "visible" not in caplog.text
