"""Model ``mia``: the research loop end to end on the real engine (tiny model), real tools and memory."""

from __future__ import annotations

import asyncio

import httpx
from openai import OpenAI

from mia_engine.agent.loop import NO_ANSWER
from mia_engine.config import load_config

QUESTION = [{"role": "user", "content": "Which river flows through the capital of France?"}]


def chosen_answer(reply) -> str:
    """The final answer of the rollout the reply chose (its ``mia`` trace), which its content must be.
    The tiny model under structured outputs always writes one (an answer starts with a visible character,
    and the last allowed turn may only answer), so a reply carrying the loop's fallback is a bug."""
    mia = reply.model_extra["mia"]
    final = mia["rollouts"][mia["chosen"]]["final_answer"]
    assert final and final.strip() and final != NO_ANSWER, mia
    return final


def _metric(server, line_prefix: str) -> float:
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith(line_prefix):
            return float(line.split()[-1])
    return 0.0


def test_research_with_four_rollouts_tools_judge_and_memory(tiny_server, openai_client: OpenAI,
                                                            admin_openai_client: OpenAI) -> None:
    out = admin_openai_client.chat.completions.create(
        model="mia", messages=QUESTION, extra_body={"rollouts": 4, "ground_truth": ["Seine"], "learn": True,
                                                    "return_trace": True})
    answer = out.choices[0].message.content
    assert answer == chosen_answer(out)  # not the "No answer was found." fallback
    assert out.choices[0].finish_reason == "stop"
    trace = out.model_extra["mia"]
    assert len(trace["rollouts"]) == 4 and 0 <= trace["chosen"] < 4
    calls = [c for r in trace["rollouts"] for c in r["tool_calls"]]
    assert calls and any(c["is_success"] and "Doc 1(Title:" in c["result"] for c in calls)
    for rollout in trace["rollouts"]:
        assert rollout["verdict"]["source"] == "supervised" and rollout["verdict"]["label"] in "ABC"
        assert 0.0 <= rollout["reward"] <= 1.0
        assert len(rollout["turns"]) == len(rollout["observations"]) >= 1
    assert set(trace["timings"]) >= {"retrieve", "plan", "route", "execute", "judge", "consolidate"}
    assert trace["new_memory_ids"], "a judged question must leave a workflow memory"
    headers = {"Authorization": f"Bearer {tiny_server.admin_key}"}  # stored questions: the admin scope's
    for memory_id in trace["new_memory_ids"]:
        stored = httpx.get(f"{tiny_server.openai_url}/memory/{memory_id}", headers=headers)
        assert stored.status_code == 200 and stored.json()["question"] == QUESTION[0]["content"]

    again = openai_client.chat.completions.create(model="mia", messages=QUESTION)
    assert set(trace["new_memory_ids"]) & set(again.model_extra["mia"]["memory_ids_used"])


def test_a_learning_question_samples_a_group_by_default(admin_openai_client: OpenAI) -> None:
    """Without ``rollouts`` a question is answered on the low-latency path (G = 1), but one that learns
    gets the learning G: a group of one carries no GRPO signal, so its update would always be rejected."""
    out = admin_openai_client.chat.completions.create(
        model="mia", messages=[{"role": "user", "content": "Which sea does the Danube reach?"}],
        extra_body={"learn": True, "ground_truth": ["Black Sea"]})
    assert len(out.model_extra["mia"]["rollouts"]) == load_config("tiny").agent.num_rollouts > 1


PROTOCOL_TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "<tool_response>")


def test_a_research_answer_holds_no_plan_replan_or_thinking_text(openai_client: OpenAI) -> None:
    """What the Planner and the Executor wrote on the way (plans, the reflection, replans, think blocks)
    stays in the trace: the answer is only the answer (the tiny model writes nonsense, so any leak shows)."""
    out = openai_client.chat.completions.create(
        model="mia", messages=[{"role": "user", "content": "Which city is the capital of Peru?"}],
        extra_body={"return_trace": True})
    answer = out.choices[0].message.content
    assert answer == chosen_answer(out)  # the Executor's own answer is what is checked, not the fallback
    assert not any(tag in answer for tag in PROTOCOL_TAGS), answer
    for rollout in out.model_extra["mia"]["rollouts"]:
        written = [rollout["plan"], rollout["reflection"], rollout["replan"],
                   *(turn.split("</think>")[0].replace("<think>", "") for turn in rollout["turns"])]
        leaked = [text for text in written if text and len(text.strip()) >= 12 and text.strip() in answer]
        assert not leaked, (answer, leaked)


def test_research_streams_one_chunk_per_stage(openai_client: OpenAI) -> None:
    chunks = list(openai_client.chat.completions.create(model="mia", messages=QUESTION, stream=True))
    stages = [c.model_extra["mia"]["stage"] for c in chunks if c.model_extra.get("mia") and "stage" in c.model_extra["mia"]]
    assert stages[:2] == ["plans", "plan_chosen"], stages
    assert "tool_call" in stages and "observation" in stages and "answer" in stages, stages
    progress = [c.choices[0].delta.model_extra.get("reasoning_content") for c in chunks if c.choices]
    assert any(p and "tool_call" in p for p in progress)
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
    assert len(final) == 1 and final[0].choices[0].delta.content == chosen_answer(final[0])


def test_client_disconnect_cancels_the_research(tiny_server) -> None:
    metric = 'mia_requests_total{model="mia",status="cancelled"}'
    before = _metric(tiny_server, metric)
    body = {"model": "mia", "messages": QUESTION, "stream": True, "rollouts": 4}
    with httpx.stream("POST", f"{tiny_server.openai_url}/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {tiny_server.api_key}"}) as response:
        assert response.status_code == 200
        for i, _ in enumerate(response.iter_lines()):
            if i >= 2:
                break
    for _ in range(100):
        if _metric(tiny_server, metric) > before:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert _metric(tiny_server, metric) == before + 1
    in_flight = _metric(tiny_server, 'mia_requests_in_flight{model="executor"}')
    assert in_flight == 0


def test_metrics_show_the_research_loop_stages_and_tokens_per_role(tiny_server, openai_client: OpenAI) -> None:
    """One ``mia`` question moves the per-stage histograms and the per-role token and prefix-cache
    counters; every stage it started has finished (in-flight gauges back to where they were)."""
    stages = ("retrieve", "plan", "execute", "execute_turn", "tool_call")
    before = {s: _metric(tiny_server, f'mia_research_stage_seconds_count{{stage="{s}"}}') for s in stages}
    prompt = _metric(tiny_server, 'mia_role_prompt_tokens_total{role="executor"}')
    openai_client.chat.completions.create(model="mia", messages=QUESTION, extra_body={"rollouts": 1})
    for stage in stages:
        assert _metric(tiny_server, f'mia_research_stage_seconds_count{{stage="{stage}"}}') > before[stage], stage
    assert _metric(tiny_server, 'mia_role_prompt_tokens_total{role="executor"}') > prompt
    assert _metric(tiny_server, 'mia_role_completion_tokens_total{role="planner"}') > 0
    text = httpx.get(f"{tiny_server.base_url}/metrics").text
    assert 'mia_role_prefix_cached_tokens_total{role="executor"}' in text
    # a later Executor turn re-sends the earlier ones: the prefix cache serves some of them
    assert _metric(tiny_server, 'mia_role_prefix_cached_tokens_total{role="executor"}') > 0
