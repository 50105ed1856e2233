"""A server run as an operator runs one: ``--server.log_format=json`` (one JSON object per log line, vLLM's
engine processes included), and SIGTERM while a request streams (the request finishes within
``server.shutdown_timeout_s``, then the server exits, its engine core given time to tear down: a kill
halfway leaves the shared memory it made for its workers for the resource tracker to report)."""

from __future__ import annotations

import json
import signal
import time

from openai import OpenAI

from tests.conftest import ServerHandle, launch_tiny, server_fixture
from tests.processes import wait_group_exit

JSON_KEYS = {"time", "level", "logger", "message"}
LONG_TOKENS = 3000
"""A completion that runs for several seconds on the tiny model (longer than the old fixed 5 s grace)."""


# its own process group: the SIGTERM test waits for all of it to exit
json_server = server_fixture("json_server", launch_tiny("json_server", "--server.log_format=json", own_group=True))


def _records(server: ServerHandle) -> list[dict]:
    """The log's JSON records (a progress bar may share a line with the record after it; third-party
    prints and progress bars are not log records)."""
    records = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        start = line.find('{"time"')
        if start >= 0:
            records.append(json.loads(line[start:]))
    return records


def test_json_log_lines_parse(json_server: ServerHandle) -> None:
    records = _records(json_server)
    assert records and all(JSON_KEYS <= set(record) for record in records)
    loggers = {record["logger"].split(".")[0] for record in records}
    assert {"mia_engine", "uvicorn", "vllm"} <= loggers, loggers
    assert any(record["logger"] == "vllm.v1.engine.core" for record in records), "no record of the engine process"
    text = json_server.log_path.read_text(errors="replace")
    assert "(EngineCore" not in text and "INFO 1" not in text, "vLLM logged in its text format"


def test_sigterm_lets_a_streaming_request_finish(json_server: ServerHandle) -> None:
    """Runs last in the module: it stops the server."""
    client = OpenAI(base_url=json_server.openai_url, api_key=json_server.api_key, max_retries=0, timeout=300)
    stream = client.chat.completions.create(
        model="manager", messages=[{"role": "user", "content": "Count."}], max_tokens=LONG_TOKENS, stream=True,
        extra_body={"ignore_eos": True})  # no early end
    num_chunks, finish_reason, stopped_at = 0, None, None
    for chunk in stream:
        if stopped_at is None:
            json_server.process.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
        if chunk.choices:
            num_chunks += 1
            finish_reason = chunk.choices[0].finish_reason or finish_reason
    ran_on_s = time.monotonic() - stopped_at
    assert finish_reason == "length" and num_chunks > LONG_TOKENS // 2, (finish_reason, num_chunks, ran_on_s)
    print(f"the request ran on for {ran_on_s:.1f} s after SIGTERM")
    # uvicorn re-raises the signal once it has shut down: the process ends by SIGTERM, as asked
    assert json_server.process.wait(timeout=60) in (0, -signal.SIGTERM), json_server.log_tail()
    assert not wait_group_exit(json_server.process.pid), json_server.log_tail()
    records = _records(json_server)
    assert any("Waiting for connections to close" in r["message"] for r in records)
    assert not [r["message"] for r in records if "force killing" in r["message"]]  # the engine core's teardown
    assert "leaked shared_memory" not in json_server.log_path.read_text(errors="replace")
