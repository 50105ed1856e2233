"""Plans as searches and replayed verified plans (``agent.plan_form = "searches"``,
``agent.replay_min_similarity``) through the real server on the tiny model: the Planner writes its plan
under the searches regex, the Executor runs those searches, and a stored success for the same question
is written again exactly (a literal regex compiled by the real structured-output backend)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from mia_engine.agent.plan_searches import parse_plan_searches, plan_searches_regex
from mia_engine.config import load_config
from tests.conftest import ServerHandle, _openai, _serve_tiny

OVERRIDES = ("--agent.plan_form=searches", "--agent.replay_min_similarity=0.95", "--agent.first_query=question",
             "--agent.answer_from=evidence", "--agent.max_replans=0")
QUESTION = "Which river flows through Paris?"
STORED_PLAN = "Search: Seine (river) | Paris\nSearch: Île de la Cité\n"
"""A plan with regex metacharacters and a non-ASCII letter: the replay's literal regex must escape them."""


@pytest.fixture(scope="module")
def searches_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    yield from _serve_tiny(tmp_path_factory.mktemp("searches_server"), *OVERRIDES)


def _ask(client: OpenAI, question: str, **extra: object) -> dict:
    out = client.chat.completions.create(model="mia", messages=[{"role": "user", "content": question}],
                                         extra_body={"return_trace": True, **extra})
    return out.model_extra["mia"]


def _searched(rollout: dict) -> list[list[str]]:
    return [call["arguments"]["query_list"] for call in rollout["tool_calls"]]


def test_the_plan_is_its_searches_and_the_executor_runs_them(searches_server: ServerHandle) -> None:
    agent = load_config("tiny").agent
    (rollout,) = _ask(_openai(searches_server, 300), "In which year was the University of Bologna founded?")["rollouts"]
    assert re.fullmatch(plan_searches_regex(agent.max_plan_searches, agent.regex.max_query_chars),
                        rollout["plan"] + "\n")  # the loop keeps plans stripped
    planned = parse_plan_searches(rollout["plan"], agent.max_plan_searches)
    assert _searched(rollout) == [["In which year was the University of Bologna founded?"], *[[q] for q in planned]]


def test_a_stored_success_for_the_same_question_is_replayed_and_learning_explores(
        searches_server: ServerHandle) -> None:
    added = httpx.post(f"{searches_server.openai_url}/memory/add", timeout=60,
                       headers={"Authorization": f"Bearer {searches_server.admin_key}"},
                       json={"question": QUESTION, "workflow_summary": STORED_PLAN, "label": "correct",
                             "plan": STORED_PLAN})
    assert added.status_code == 200, added.text
    trace = _ask(_openai(searches_server, 300), QUESTION)
    (rollout,) = trace["rollouts"]
    assert rollout["plan"] == STORED_PLAN.strip() and added.json()["id"] in trace["memory_ids_used"]
    assert _searched(rollout) == [[QUESTION], ["Seine (river) | Paris"], ["Île de la Cité"]]

    other = _ask(_openai(searches_server, 300), "Who painted the Mona Lisa?")  # another question
    assert other["rollouts"][0]["plan"] != STORED_PLAN.strip()

    learning = _ask(_openai(searches_server, 300, searches_server.admin_key), QUESTION, rollouts=2, learn=True,
                    ground_truth=["Seine"])
    plans = [r["plan"] for r in learning["rollouts"]]
    assert len(plans) == 2 and any(plan != STORED_PLAN.strip() for plan in plans)  # sampled, not replayed
