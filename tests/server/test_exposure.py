"""What an API key holder must not learn from a real server on 127.0.0.1: the adapters' folders on the
server's disk, the learned questions in the memory (search and get are admin routes), and a failing
tool's error text (server paths, URLs) in the research trace; the server log keeps the full text."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import SERVING_ONLY, ServerHandle, launch_tiny, server_fixture

SECRET_PATH = "/private-endpoint-5f1c/search"
QUESTION = "Which river flows through Paris?"


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_adapter_listing_shows_folders_to_the_admin_only(tiny_server: ServerHandle) -> None:
    url = f"{tiny_server.openai_url}/adapters"
    as_user = httpx.get(url, headers=_headers(tiny_server.api_key))
    assert as_user.status_code == 200, as_user.text
    versions = as_user.json()["data"]
    assert versions and all(v["path"] is None for v in versions)
    assert all(v["name"] == f"{v['role']}@v{v['version']}" for v in versions)
    assert not any(secret in as_user.text for secret in (str(tiny_server.home), str(tiny_server.data_dir)))
    assert not re.search(r'"/', as_user.text), as_user.text  # no absolute path anywhere in the body
    as_admin = httpx.get(url, headers=_headers(tiny_server.admin_key)).json()["data"]
    assert as_admin and all(v["path"].startswith("/") for v in as_admin)


def test_stored_questions_are_read_with_the_admin_key_only(tiny_server: ServerHandle) -> None:
    url, user, admin = tiny_server.openai_url, _headers(tiny_server.api_key), _headers(tiny_server.admin_key)
    question = "Who painted the exposure test's ceiling?"
    added = httpx.post(f"{url}/memory/add", headers=admin, timeout=60, json={
        "question": question, "workflow_summary": "1. **search** (-> Michelangelo)", "label": "correct"})
    assert added.status_code == 200, added.text
    memory_id = added.json()["id"]
    refused = [httpx.post(f"{url}/memory/search", json={"question": question}, headers=user, timeout=60),
               httpx.get(f"{url}/memory/{memory_id}", headers=user)]
    for response in refused:
        assert response.status_code == 403, (response.request.url, response.text)
        assert response.json()["error"]["code"] == "insufficient_scope" and question not in response.text
    assert httpx.get(f"{url}/memory/stats", headers=user).status_code == 200  # counts only
    found = httpx.post(f"{url}/memory/search", json={"question": question}, headers=admin, timeout=60)
    assert found.status_code == 200 and question in found.text
    assert httpx.get(f"{url}/memory/{memory_id}", headers=admin).json()["question"] == question


class _Failing(BaseHTTPRequestHandler):
    """A search endpoint that answers 500 to everything."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def failing_search_url() -> Iterator[str]:
    http = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}{SECRET_PATH}"
    finally:
        http.shutdown()
        http.server_close()


def _launch_web_server(factory: pytest.TempPathFactory, failing_search_url: str) -> ServerHandle:
    """Web search against the failing endpoint; the first search is the question itself (pinned)."""
    return launch_tiny("web_server", "--tools.search_backend=web", "--tools.serper_api_key=test-serper-key",
                       f"--tools.serper_url={failing_search_url}", "--agent.first_query=question",
                       "--agent.max_turns=2", "--agent.max_replans=0", *SERVING_ONLY)(factory)


web_server = server_fixture("web_server", _launch_web_server, needs=("failing_search_url",))


def test_a_failing_tool_shows_its_error_class_not_the_url(web_server: ServerHandle, failing_search_url: str) -> None:
    response = httpx.post(f"{web_server.openai_url}/chat/completions", headers=_headers(web_server.api_key),
                          timeout=300, json={"model": "mia", "messages": [{"role": "user", "content": QUESTION}],
                                             "return_trace": True})
    assert response.status_code == 200, response.text
    calls = [c for r in response.json()["mia"]["rollouts"] for c in r["tool_calls"] if c["name"] == "search"]
    assert calls, response.text
    for call in calls:
        assert not call["is_success"] and call["result"].startswith("Error: web search failed for ")
        assert call["result"].endswith(": HTTPStatusError (HTTP 500)"), call["result"]
    port = failing_search_url.split(":")[2].split("/")[0]
    assert SECRET_PATH not in response.text and f":{port}" not in response.text
    assert failing_search_url in web_server.log_path.read_text(errors="replace")  # the operator still sees it
