"""Property-based fuzzing of every route in the served ``/openapi.json`` against the real tiny server.

Bodies are drawn from each route's JSON schema (hypothesis-jsonschema), then some are broken on purpose
(other JSON values, raw bytes, wrong content types, other keys). Whatever arrives, the server must answer
with something below 500 and stay healthy. The server has its own data dir and small limits, so the
requests that do pass validation (generation, research, memory writes, GRPO updates) stay cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ServerHandle, _serve_tiny

hypothesis_jsonschema = pytest.importorskip("hypothesis_jsonschema")

NUM_REQUESTS = 1000
MODELS = ["planner", "executor", "manager", "judge", "mia", "no-such-model"]
ROLES = ["planner", "executor", "manager", "x"]
SMALL_LIMITS = ("--server.max_n=2", "--server.limits.max_tokens=4", "--server.limits.max_rollouts=1",
                "--server.limits.max_grpo_groups=2", "--server.limits.max_grpo_completions=3",
                "--server.limits.max_grpo_tokens=256", "--server.admission.max_concurrent_research=1",
                "--agent.max_turns=2")
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    yield from _serve_tiny(tmp_path_factory.mktemp("fuzz_server"), *SMALL_LIMITS)


def _operations(document: dict) -> list[tuple[str, str, dict | None]]:
    """(method, path, body schema with its components) of every documented operation."""
    operations = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            schema = None if body is None else {**body, "components": document["components"]}
            operations.append((method.upper(), path, schema))
    return operations


def _body_strategy(schema: dict | None) -> st.SearchStrategy[tuple[bytes, str]]:
    """(body, content type): mostly schema-valid JSON, sometimes other JSON, bytes or a wrong type."""
    valid = st.nothing() if schema is None else hypothesis_jsonschema.from_schema(_steered(schema))
    as_json = st.one_of(valid, JSON).map(lambda v: json.dumps(v).encode())
    raw = st.binary(max_size=64)
    return st.one_of(
        st.tuples(as_json, st.just("application/json")),
        st.tuples(as_json, st.just("application/json")),
        st.tuples(as_json, st.just("application/json")),
        st.tuples(raw, st.sampled_from(["application/json", "application/x-ndjson"])),
        st.tuples(as_json, st.sampled_from(["text/plain", "", "application/x-www-form-urlencoded"])),
    )


def _steered(schema: dict) -> dict:
    """Point ``model`` at real ids (a random string is only ever a 404) and keep lists short."""
    schema = json.loads(json.dumps(schema))
    chat = schema["components"]["schemas"].get("ChatCompletionRequest")
    if chat is not None:
        chat["properties"]["model"] = {"enum": MODELS}
        chat["properties"]["messages"]["maxItems"] = 3
    return schema


def _path(path: str, data: st.DataObject) -> str:
    for name, choices in (("{role}", ROLES), ("{memory_id}", None), ("{model:path}", MODELS)):
        if name in path:
            value = data.draw(st.sampled_from(choices) if choices else st.text(min_size=1, max_size=12))
            path = path.replace(name, quote(value, safe=""))
    return path


@pytest.mark.slow
def test_1000_fuzzed_requests_never_get_a_5xx(fuzz_server: ServerHandle) -> None:
    http = httpx.Client(base_url=fuzz_server.base_url, timeout=120)
    document = http.get("/openapi.json").json()
    operations = _operations(document) + [("GET", "/health", None), ("GET", "/metrics", None)]
    assert len(operations) >= 14
    keys = [fuzz_server.admin_key] * 3 + [fuzz_server.api_key, "wrong", ""]
    statuses: list[tuple[int, str, str]] = []

    for method, path, schema in operations:
        bodies = _body_strategy(schema)

        @settings(max_examples=NUM_REQUESTS // len(operations) + 1, deadline=None, derandomize=True,
                  database=None, suppress_health_check=list(HealthCheck))
        @given(data=st.data(), body=bodies, key=st.sampled_from(keys))
        def one_request(data: st.DataObject, body: tuple[bytes, str], key: str) -> None:
            content, content_type = body
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            if content_type:
                headers["Content-Type"] = content_type
            send = method not in ("GET", "DELETE")
            response = http.request(method, _path(path, data), content=content if send else None, headers=headers)
            statuses.append((response.status_code, method, path))
            assert response.status_code < 500, (method, path, content[:300], response.text[:300])

        one_request()

    assert len(statuses) >= NUM_REQUESTS
    assert {s for s, _, _ in statuses} & {200}, "some fuzzed requests must get through validation"
    assert http.get("/health").status_code == 200
    assert http.post("/v1/chat/completions", json={"model": "planner", "messages": [{"role": "user", "content": "hi"}]},
                     headers={"Authorization": f"Bearer {fuzz_server.api_key}"}).status_code == 200
    print(f"\n{len(statuses)} fuzzed requests; statuses: "
          f"{ {s: sum(1 for x, _, _ in statuses if x == s) for s in sorted({x for x, _, _ in statuses})} }")
