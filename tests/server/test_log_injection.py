"""Client text in the server log (``base/log_text.py``, ``server/access_log.py``, ``base/logs.py``): a field
name or a path cannot forge a log line, a body of a million keys cannot write a megabyte one, and the access
log (``--server.access_log=true``, on conftest's ``public_server``, in the text format) is one escaped,
bounded line per request that names the key's name, never the key. The JSON format's escapes are checked on
its formatter."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import httpx

from mia_engine.base.log_text import MAX_LOGGED_CHARS, MAX_LOGGED_NAMES, bounded_names, printable
from mia_engine.base.logs import CONTINUATION, JsonFormatter, TextFormatter
from tests.conftest import ServerHandle

FORGED = "2026-01-01 ERROR forged"
MAX_LINE_CHARS = 4 * MAX_LOGGED_CHARS + MAX_LOGGED_NAMES * 80
"""The longest line a request's text may make in the log (the ignored-fields warning is the longest)."""
HOSTILE = ("\n", "\r", "\x1b", "\x85", "\u2028", "\u2029", "\u202e")
"""Characters that end a line for some log reader, or steer a terminal or the order a reader sees."""

ACCESS_LINE_WAIT_S = 10.0
"""An access-log line is written once its response is sent: its client may read the log before it."""


def _log_after(server: ServerHandle, offset: int, *awaited: str) -> str:
    """The log written since ``offset``, once it holds each of the ``awaited`` texts (or after
    ``ACCESS_LINE_WAIT_S``: the assertions then say what is missing)."""
    deadline = time.monotonic() + ACCESS_LINE_WAIT_S
    while True:
        text = server.log_path.read_bytes()[offset:].decode("utf-8", errors="replace")
        if all(part in text for part in awaited) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def _chat(server: ServerHandle, raw: bytes) -> httpx.Response:
    return httpx.post(f"{server.openai_url}/chat/completions", content=raw, timeout=120,
                      headers={"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"})


def _body(extra: str) -> bytes:
    return ('{"model": "manager", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + extra
            + "}").encode()


def _assert_unforged(text: str, *, may_continue: bool = False) -> None:
    """No line of ``text`` starts as the forged record (``may_continue``: but as a record's indented further
    line), and none of it holds a raw line-ending character."""
    starts = [line if may_continue else line.lstrip() for line in text.split("\n")]
    assert not [line for line in starts if line.startswith(FORGED)], text[-2000:]
    assert not any(char in text for char in HOSTILE[1:]), [char for char in HOSTILE[1:] if char in text]


def test_a_field_name_cannot_forge_a_log_line(public_server: ServerHandle) -> None:
    offset = public_server.log_path.stat().st_size
    names = [f"x\n{FORGED}", f"y\r{FORGED}", "\x1b[2Jz", "\u2028w", "\u202ev"]
    response = _chat(public_server, _body("".join(f", {json.dumps(name)}: 1" for name in names)))
    assert response.status_code == 200, response.text
    text = _log_after(public_server, offset)
    _assert_unforged(text)
    warning = next(line for line in text.splitlines() if "were ignored" in line)
    assert "'x\\n2026-01-01 ERROR forged', 'y\\r2026-01-01 ERROR forged', '\\x1b[2Jz', '\\u2028w', '\\u202ev'" \
        in warning, warning


def test_a_body_of_many_unknown_keys_logs_one_bounded_line(public_server: ServerHandle) -> None:
    num_keys = 550_000  # ~7.7 MB of keys: under the 8 MiB body limit
    keys = "".join(f',"k{i:07d}":0' for i in range(num_keys))
    offset = public_server.log_path.stat().st_size
    response = _chat(public_server, _body(keys))
    assert response.status_code == 200, response.text
    lines = _log_after(public_server, offset).splitlines()
    assert max(len(line) for line in lines) <= MAX_LINE_CHARS, max(len(line) for line in lines)
    warning = next(line for line in lines if "were ignored" in line)
    assert "'k0000000', 'k0000001'" in warning and f"and {num_keys - MAX_LOGGED_NAMES} more" in warning


def test_a_path_cannot_forge_an_access_log_line(public_server: ServerHandle) -> None:
    offset = public_server.log_path.stat().st_size
    headers = {"Authorization": f"Bearer {public_server.api_key}"}
    forged = httpx.get(f"{public_server.base_url}/v1/models%0A2026-01-01%20ERROR%20forged%0D%1B%E2%80%A8",
                       headers=headers)
    assert forged.status_code == 404
    long_path = "/v1/" + "a" * 20_000
    assert httpx.get(public_server.base_url + long_path, headers=headers).status_code == 404
    text = _log_after(public_server, offset, '"GET /v1/models\\n', '"GET /v1/aaaa')
    _assert_unforged(text)
    assert '"GET /v1/models\\n2026-01-01 ERROR forged\\r\\x1b\\u2028" 404 ' in text, text[-2000:]
    line = next(line for line in text.splitlines() if '"GET /v1/aaaa' in line)
    assert len(line) < 2 * MAX_LOGGED_CHARS and f"...(+{len(long_path) - MAX_LOGGED_CHARS} chars)" in line, line


def test_the_access_log_line_names_address_method_path_status_bytes_and_time(public_server: ServerHandle) -> None:
    offset = public_server.log_path.stat().st_size
    response = httpx.get(f"{public_server.openai_url}/models?token=not-logged",
                         headers={"Authorization": f"Bearer {public_server.api_key}"})
    assert response.status_code == 200
    unauthorised = httpx.get(f"{public_server.openai_url}/models", headers={"Authorization": "Bearer wrong-key"})
    assert unauthorised.status_code == 401
    text = _log_after(public_server, offset, '"GET /v1/models" 200 ', '"GET /v1/models" 401 ')
    pattern = r'mia_engine\.server\.access_log: 127\.0\.0\.1:\d+ \S+ "GET /v1/models" {} {} B \d+\.\d ms$'
    assert re.search(pattern.format(200, len(response.content)), text, re.MULTILINE), text[-2000:]
    assert re.search(pattern.format(401, len(unauthorised.content)), text, re.MULTILINE), text[-2000:]
    assert public_server.api_key not in text and "not-logged" not in text and "wrong-key" not in text
    assert '"GET /v1/models HTTP/1.1"' not in text  # uvicorn's own access log is off


# ---- the log lines that hold a path, the helper and the formatters -------------------------------------------


def test_an_internal_errors_path_is_escaped_in_its_log_line(caplog) -> None:
    """The 500 handler's line (``app._internal_error``) holds the percent-decoded path, escaped (the URL parser
    drops a raw newline by itself; a vertical tab, ESC or U+2028 it keeps)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.testclient import TestClient

    from mia_engine.server.app import _internal_error

    class Boom:
        def __init__(self, app) -> None:
            self.app = app

        async def __call__(self, scope, receive, send) -> None:
            raise RuntimeError("boom")

    app = Starlette(middleware=[Middleware(Boom)], exception_handlers={Exception: _internal_error})
    with caplog.at_level(logging.ERROR, logger="mia_engine.server.app"):
        response = TestClient(app, raise_server_exceptions=False).get(
            "/v1/x%0B2026-01-01%20ERROR%20forged%1B%E2%80%A8")
    assert response.status_code == 500
    messages = [r.getMessage() for r in caplog.records if r.name == "mia_engine.server.app"]
    assert messages == [f"internal error on GET /v1/x\\x0b{FORGED}\\x1b\\u2028"], messages


async def test_an_abandoned_requests_path_is_escaped_in_its_log_line(caplog) -> None:
    """The send deadline's line (``deadlines.py``) holds the percent-decoded path, escaped."""
    from mia_engine.config import AdmissionConfig
    from mia_engine.server.deadlines import DeadlineMiddleware

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def never_read(message) -> None:
        await asyncio.Event().wait()

    scope = {"type": "http", "method": "GET", "path": f"/v1/x\n{FORGED}", "client": ("127.0.0.1", 5)}
    with caplog.at_level(logging.WARNING, logger="mia_engine.server.deadlines"):
        await DeadlineMiddleware(app, AdmissionConfig(send_timeout_s=0.05))(scope, None, never_read)
    messages = [r.getMessage() for r in caplog.records if r.name == "mia_engine.server.deadlines"]
    assert len(messages) == 1 and messages[0].startswith(f"GET /v1/x\\n{FORGED} from 127.0.0.1 abandoned"), messages


def test_printable_escapes_and_bounds() -> None:
    assert printable("/v1/chat/completions") == "/v1/chat/completions"
    assert printable("a\nb\rc\td\\e\x00\x1b\x7f\x85\u2028\u2029\u202e\u2066\ufeff\U000e0001") == \
        "a\\nb\\rc\\td\\\\e\\x00\\x1b\\x7f\\x85\\u2028\\u2029\\u202e\\u2066\\ufeff\\U000e0001"
    assert printable("é中文 ok") == "é中文 ok"
    assert printable("x" * 300, 10) == "x" * 10 + "...(+290 chars)"
    assert printable("\n" * 300, 11) == "\\n" * 5 + "...(+295 chars)"  # an escape is never cut in two
    assert bounded_names(["a", "b\n"] * 15, max_names=3) == "'a', 'b\\n', 'a' and 27 more"


def _record(message: str, *args: object, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("mia_engine.test", logging.WARNING, __file__, 1, message, args, exc_info)


def test_the_text_format_keeps_a_record_on_its_own_lines() -> None:
    """Whatever a record holds (a message or a traceback another component wrote raw), each of its lines
    after the first is indented, and no character in it ends a line for a reader or steers a terminal."""
    try:
        raise ValueError(f"bad\n{FORGED}")
    except ValueError as err:
        record = _record("raw %s", f"x\n{FORGED}\r\x1b[2J\u2028\x85", exc_info=(type(err), err, err.__traceback__))
    text = TextFormatter().format(record)
    _assert_unforged(text, may_continue=True)
    first, *rest = text.split("\n")
    assert first.endswith("WARNING mia_engine.test: raw x")
    assert rest and all(line.startswith(CONTINUATION) for line in rest)
    assert f"{CONTINUATION}{FORGED}\\r\\x1b[2J\\u2028\\x85" in text


def test_the_json_format_escapes_what_json_dumps_leaves_raw() -> None:
    message = "x\n" + "".join(HOSTILE) + "\u061c\x9f\x7f"
    line = JsonFormatter().format(_record("%s", message))
    assert len(line.splitlines()) == 1 and not any(char in line for char in HOSTILE + ("\x9f", "\x7f", "\u061c"))
    assert json.loads(line)["message"] == message
