"""Plans as searches and replayed verified plans (``agent.plan_form = "searches"``,
``agent.replay_min_similarity``) through the real server on the tiny model: the Planner writes its plan
under the searches regex, the Executor runs those searches, and a stored success for the same question
is written again exactly (a literal regex compiled by the real structured-output backend). The same
server asks the closed-book candidate (``agent.answer_choice``) and judges without gold by the evidence
(``agent.unsupervised_judge = "grounded"``)."""

from __future__ import annotations

import re

import httpx
from openai import OpenAI

from mia_engine.agent.plan_searches import parse_plan_searches, plan_searches_regex
from mia_engine.config import load_config
from tests.conftest import SERVING_ONLY, ServerHandle, _openai, launch_tiny, server_fixture

OVERRIDES = ("--agent.plan_form=searches", "--agent.replay_min_similarity=0.95", "--agent.first_query=question",
             "--agent.answer_from=evidence", "--agent.max_replans=0", "--agent.answer_choice=closed_book",
             "--agent.unsupervised_judge=grounded")
"""The small_model profile's loop, spelled out (the tiny config runs the paper's)."""
QUESTION = "Which river flows through Paris?"
STORED_PLAN = "Search: Seine (river) | Paris\nSearch: Île de la Cité\n"
"""A plan with regex metacharacters and a non-ASCII letter: the replay's literal regex must escape them."""


searches_server = server_fixture("searches_server", launch_tiny("searches_server", *OVERRIDES, *SERVING_ONLY))


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


def test_the_closed_book_candidate_is_asked_and_the_answer_chosen_from_the_two(searches_server: ServerHandle) -> None:
    """The trace holds the Manager's answer without tools; the returned answer is either the rollout's own
    or that one, as ``answer_source`` says, and the own answer is kept when it was replaced."""
    client = _openai(searches_server, 300)
    out = client.chat.completions.create(model="mia", messages=[{"role": "user", "content": QUESTION}],
                                         extra_body={"return_trace": True})
    trace = out.model_extra["mia"]
    (rollout,) = trace["rollouts"]
    assert isinstance(trace["closed_book"], str) and trace["timings"]["closed_book"] > 0
    assert rollout["answer_source"] in ("own", "closed_book")
    if rollout["answer_source"] == "closed_book":
        assert out.choices[0].message.content == rollout["final_answer"] == trace["closed_book"]
        assert rollout["own_answer"] is not None
    else:
        assert rollout["own_answer"] is None


def test_learning_without_gold_is_judged_by_the_evidence(searches_server: ServerHandle) -> None:
    trace = _ask(_openai(searches_server, 300, searches_server.admin_key), "Who painted the Mona Lisa?", rollouts=2,
                 learn=True)
    for rollout in trace["rollouts"]:
        verdict = rollout["verdict"]
        assert verdict["source"] == "unsupervised" and verdict["reason"].startswith("grounded"), verdict
        assert verdict["reviews"] == []
