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
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mia_engine.server.body import decode_body
from mia_engine.server.completion_bodies import CompletionRequest
from mia_engine.server.errors import BadRequest
from mia_engine.server.openai_bodies import ChatCompletionRequest
from tests.conftest import SERVING_ONLY, ServerHandle, launch_tiny, server_fixture

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


fuzz_server = server_fixture("fuzz_server", launch_tiny("fuzz_server", *SMALL_LIMITS, *SERVING_ONLY))


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


# Hostile JSON, for the 3000-request run below: each fragment is spliced into a field of a valid body.
NUM_HOSTILE = 3000
VALID = {  # route -> a valid body with "@@" where a fragment goes (routes whose valid requests change nothing)
    "/v1/chat/completions": b'{"model":"planner","messages":[{"role":"user","content":"hi"}],"max_tokens":1@@}',
    "/v1/completions": b'{"model":"planner","prompt":"hi","max_tokens":1@@}',
    "/tokenize": b'{"model":"planner","prompt":"hi"@@}',
    "/detokenize": b'{"model":"planner","tokens":[1,2]@@}',
    "/v1/memory/search": b'{"question":"hi"@@}',
}
ADMIN_ROUTES = ("/v1/adapters/planner", "/v1/adapters/planner/grpo", "/v1/memory/add", "/v1/memory/import")
FIELDS = {  # where a fragment goes in a body: an ignored field, a known one, a duplicated key, a nested one
    "ignored": b',"x":@@', "max_tokens": b',"max_tokens":@@', "temperature": b',"temperature":@@',
    "seed": b',"seed":@@', "logit_bias": b',"logit_bias":{"1":@@}', "logit_bias_key": b',"logit_bias":{"@@":1}',
    "n": b',"n":@@', "top_p": b',"top_p":@@',
    "stop": b',"stop":@@', "duplicate": b',"max_tokens":1,"max_tokens":@@,"max_tokens":2',
    "response_format": b',"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":@@}}',
    "nested_ignored": b',"x":{"y":[@@]}', "messages": b',"messages":[{"role":"user","content":@@}]',
}


def _deep(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b'[{"a":' * (depth // 2) + b"1" + b"}]" * (depth // 2)


FRAGMENTS = [
    *(_deep(depth, kind) for depth in (64, 500, 999, 1000, 1001, 5000, 100_000)
      for kind in ("array", "object", "mixed")),
    b"[" * 5000, b'{"a":' * 5000,  # unclosed
    b"1e400", b"-1e400", b"1e-400", b"9" * 400, b"-" + b"9" * 400, b"9" * 5000, b"9" * 400 + b".5", b"1E+99999999999",
    b"NaN", b"Infinity", b"-Infinity", b"-0", b"0", b"1", b"0.5", b"true", b"null", b"[]", b"{}",
    b'"\\ud800"', b'"\\udfff\\ud800"', b'"\xff\xfe"', b'"\xc0\xaf"', b'"\xed\xa0\x80"', b'"\\u0000"', b'"a\x00b"',
    b'"\\ud83d\\ude00"', "\"\U0001F600\"".encode(), b'{"1":1,"1":2}', b'{"a":1,"a":"b","a":[]}',
    b'["a","a"]', b'"' + b"\\" * 99 + b'"', b'"' + b"x" * 100_000 + b'"',
]
WHOLE = [  # bodies broken as a whole
    b"\xef\xbb\xbf" + VALID["/v1/chat/completions"].replace(b"@@", b""), b"\xff" * 8, b"{" * 100_000,
    b"[" * 100_000 + b"]" * 100_000, VALID["/v1/chat/completions"].replace(b"@@", b"")[:-9], b"{}" * 3,
    b'{"model":"planner","model":"executor","messages":[],"messages":[{"role":"user","content":"hi"}],"max_tokens":1}',
]


def _hostile_requests(rng) -> Iterator[tuple[str, bytes, bool]]:
    """(path, body, admin key): (route, field, fragment) combinations in a seeded random order, with whole broken
    bodies and admin routes every 25th request."""
    combos = [(path, field, fragment) for path in VALID for field in FIELDS.values() for fragment in FRAGMENTS]
    rng.shuffle(combos)
    for i in range(NUM_HOSTILE):
        if i % 25 == 0:
            yield rng.choice(ADMIN_ROUTES), rng.choice(WHOLE + [_deep(5000, "array"), _deep(5000, "object")]), True
        elif i % 25 == 1:
            yield rng.choice(list(VALID)), rng.choice(WHOLE), rng.random() < 0.5
        else:
            path, field, fragment = combos[i % len(combos)]
            yield path, VALID[path].replace(b"@@", field.replace(b"@@", fragment)), rng.random() < 0.5


def test_3000_hostile_json_bodies_are_4xx_and_the_connection_stays_open(tiny_server: ServerHandle) -> None:
    """Deep nesting, huge numbers, invalid UTF-8, surrogates, NaN, duplicate keys in ignored and known fields:
    never a 5xx, an OpenAI-style body for each 4xx, and the one keep-alive connection serves them all."""
    import random

    statuses: dict[int, int] = {}
    with httpx.Client(base_url=tiny_server.base_url, timeout=60) as http:
        local_addrs = set()
        for path, body, admin in _hostile_requests(random.Random(35)):
            key = tiny_server.admin_key if admin else tiny_server.api_key
            response = http.post(path, content=body, headers={"Authorization": f"Bearer {key}",
                                                               "Content-Type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (path, body[:200], response.text[:300])
            if response.status_code >= 400:
                assert set(response.json()["error"]) >= {"message", "type", "code"}, (path, body[:200], response.text)
            assert response.headers.get("connection", "").lower() != "close", (path, body[:200], response.text)
            local_addrs.add(response.extensions["network_stream"].get_extra_info("client_addr"))
        assert len(local_addrs) == 1, "the server closed the keep-alive connection"
        assert http.get("/health").status_code == 200
    assert sum(statuses.values()) == NUM_HOSTILE and 200 in statuses, statuses
    print(f"\n{NUM_HOSTILE} hostile requests; statuses: {dict(sorted(statuses.items()))}")


def _refusal(body: bytes, struct_type: type) -> BadRequest:
    import msgspec

    with pytest.raises(BadRequest) as info:
        decode_body(body, msgspec.json.Decoder(struct_type))
    return info.value


@pytest.mark.parametrize("fragment", [_deep(5000, "array"), _deep(5000, "object"), _deep(100_000, "mixed")])
def test_deep_nesting_is_a_400_not_a_recursion_error(fragment: bytes) -> None:
    body = VALID["/v1/chat/completions"].replace(b"@@", b',"x":' + fragment)
    assert _refusal(body, ChatCompletionRequest).code == "json_too_deep"
    assert "nested too deeply" in _refusal(body, ChatCompletionRequest).message
    _refusal(fragment, ChatCompletionRequest)  # a whole body of nesting: a 400 too


def test_invalid_utf8_in_a_known_string_is_a_400() -> None:
    body = VALID["/v1/completions"].replace(b"@@", b',"stop":"\xc0\xaf"')
    assert _refusal(body, CompletionRequest).code == "invalid_utf8"


@pytest.mark.parametrize("field, value", [("seed", b"9" * 400), ("seed", b"-" + b"9" * 400), ("max_tokens", b"9" * 400),
                                          ("n", b"4294967296"), ("top_k", b"9" * 20), ("min_tokens", b"9" * 400)])
def test_integers_beyond_what_the_engine_serialises_are_a_400_naming_the_field(field: str, value: bytes) -> None:
    for path, struct_type in (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest)):
        body = VALID[path].replace(b"@@", b',"' + field.encode() + b'":' + value)
        assert _refusal(body, struct_type).param == field


def test_deep_nesting_elsewhere_is_refused_or_ignored_not_raised() -> None:
    """The other decoders of client or model JSON: the memory import's lines, the ignored-field log, the
    tool-call reader, a structured-outputs schema given as a string."""
    from mia_engine.memory.entries import InvalidMemory
    from mia_engine.memory.jsonl import decode_jsonl
    from mia_engine.server.sampling import constraint
    from mia_engine.server.ignored_fields import warn_ignored
    from mia_engine.engines.output_parsers import ForcedCalls

    deep = _deep(5000, "array")
    with pytest.raises(InvalidMemory, match="line 1: arrays and objects are nested too deeply"):
        decode_jsonl(b'{"question":' + deep + b',"kind":"entry"}\n')  # before the tag: skipped, so nested
    warn_ignored("/v1/chat/completions", b'{"x":' + deep + b"}", ChatCompletionRequest)
    assert ForcedCalls(None, None).whole(deep.decode()) == []  # not a list of calls
    assert [c.arguments for c in ForcedCalls("f", None).whole(deep.decode())] == [deep.decode()]  # read, not parsed
    request = msgspec.json.decode(VALID["/v1/chat/completions"].replace(
        b"@@", b',"structured_outputs":{"json":"' + deep + b'"}'), type=ChatCompletionRequest)
    with pytest.raises(BadRequest, match="structured_outputs.json is not valid JSON"):
        constraint(request)


def test_deeply_nested_model_output_is_an_invalid_tool_call_not_an_error() -> None:
    from mia_engine.agent.model_text import first_json_object
    from mia_engine.agent.turns import parse_tool_call

    deep = "[" * 100_000 + "]" * 100_000
    assert parse_tool_call('{"name": "search", "arguments": ' + deep + "}")[0] is None
    assert parse_tool_call('{"name": "search", "arguments": "' + deep + '"}')[0] is None
    assert first_json_object('{"a": ' + deep + "}") is None


def test_a_logit_bias_key_beyond_any_token_id_is_a_400() -> None:
    from mia_engine.server.sampling import logit_bias_ids

    for key in ("9" * 400, "9" * 5000, "2147483648", "-1"):
        with pytest.raises(BadRequest, match="is not a token id"):
            logit_bias_ids({key: 1.0})
    assert logit_bias_ids({"2147483647": 500.0}) == {2147483647: 100.0}
