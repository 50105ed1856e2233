"""Defaults are the paper's / the reference's numbers; invalid values fail at conversion."""

from __future__ import annotations


import msgspec
import pytest

from mia_engine.config.agent import PROFILES, AgentConfig, StageSampling
from mia_engine.config import ConfigError, load_config, read_toml
from mia_engine.config.tools import ToolsConfig


def test_defaults():
    config = AgentConfig()
    assert (config.num_rollouts, config.num_rollouts_low_latency, config.max_turns) == (4, 1, 20)
    assert (config.tool_response_max_words, config.max_replans, config.planner_max_words) == (0, 1, 400)  # 0: uncut (reference)
    assert config.structured_executor and config.structured_judges
    r = config.rewards
    assert (r.final, r.first, r.format, r.decision) == (0.7, 0.2, 0.05, 0.05)
    assert (r.unsupervised_verdict, r.unsupervised_format) == (0.9, 0.1)
    w = config.review_weights
    assert (w.logic, w.sourcing, w.validity) == (0.5, 0.3, 0.2)
    sampling = config.sampling
    assert sampling.reviewer.temperature == 0.1 and sampling.grader.temperature == 0.0
    assert sampling.executor.presence_penalty == 1.1
    tools = ToolsConfig()
    assert (tools.corpus, tools.search_top_k, tools.web_top_k, tools.image_top_k) == ("wiki-offline", 3, 5, 3)
    assert tools.serper_url == "" and not tools.is_web_enabled


def test_from_toml_like_dict_and_errors():
    config = msgspec.convert({"num_rollouts": 8, "rewards": {"final": 1.0}}, AgentConfig)
    assert config.num_rollouts == 8 and config.rewards.final == 1.0 and config.rewards.first == 0.2
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"num_rolouts": 8}, AgentConfig)
    with pytest.raises(msgspec.ValidationError, match="num_rollouts"):
        msgspec.convert({"num_rollouts": 0}, AgentConfig)
    with pytest.raises(msgspec.ValidationError, match="batch_wait_ms"):
        msgspec.convert({"batch_wait_ms": -1}, ToolsConfig)
    web = msgspec.convert({"serper_api_key": "k", "serper_url": "http://search.invalid"}, ToolsConfig)
    assert web.is_web_enabled


# ---- profiles and the per-stage sampling table -----------------------------------------------------

SMALL_MODEL = {"plan_form": "searches", "replay_min_similarity": 0.95, "max_replans": 0, "first_query": "question",
               "min_tool_calls": 1, "answer_from": "evidence", "workflow_summary": "extractive",
               "supervised_judge": "match", "first_image_search": False, "force_final_answer": True,
               "max_plan_searches": 2, "answer_choice": "closed_book", "unsupervised_judge": "grounded"}
"""The departures the embedded default ran before it named them a profile (its [agent] table then), and
the two it gained since (the closed-book candidate and the evidence-grounded judge)."""
PAPER = {"plan_form": "text", "replay_min_similarity": None, "max_replans": 1, "first_query": "model",
         "min_tool_calls": 0, "answer_from": "trajectory", "workflow_summary": "manager", "supervised_judge": "llm",
         "first_image_search": False, "force_final_answer": False, "max_plan_searches": 2, "answer_choice": "own",
         "unsupervised_judge": "reviewers"}
"""The paper's loop, as configs/8xgpu.toml runs it (``AgentConfig()`` differs only in forcing an answer at
the turn cap, which needs the structured Executor turns it also defaults to)."""


def _departures(config: AgentConfig) -> dict[str, object]:
    return {field: getattr(config, field) for field in SMALL_MODEL}


def test_the_default_config_selects_exactly_the_departures_it_had() -> None:
    """The profile cannot drift: the embedded default still runs the same loop, and 8xgpu.toml the paper's."""
    assert dict(PROFILES["small_model"]).items() <= SMALL_MODEL.items() and not PROFILES["paper"]
    assert _departures(load_config("default").agent) == SMALL_MODEL
    assert _departures(AgentConfig.for_profile("small_model")) == SMALL_MODEL
    assert _departures(load_config("8xgpu").agent) == PAPER and not load_config("8xgpu").agent.structured_executor
    assert _departures(AgentConfig()) == {**PAPER, "force_final_answer": True}
    assert read_toml("default")["agent"]["profile"] == "small_model"


def test_a_field_the_table_sets_wins_over_its_profile() -> None:
    config = load_config("default", {"agent.max_replans": 1, "agent.plan_form": "text"}).agent
    assert (config.max_replans, config.plan_form, config.answer_from) == (1, "text", "evidence")
    assert _departures(load_config("default", {"agent.profile": "paper"}).agent) == _departures(AgentConfig())
    with pytest.raises(ConfigError, match=r"^agent.profile: unknown profile 'tiny'"):
        load_config("default", {"agent.profile": "tiny"})


@pytest.mark.parametrize("stage", sorted(StageSampling.__struct_fields__))
def test_a_sampling_key_outside_agent_sampling_is_an_unknown_field(stage: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("tiny", {f"agent.{stage}.max_tokens": 5})
    assert str(info.value) == f"agent: Object contains unknown field `{stage}`"
    sampling = load_config("tiny", {f"agent.sampling.{stage}.max_tokens": 5}).agent.sampling
    assert getattr(sampling, stage).max_tokens == 5


def test_each_stage_keeps_its_sampling_defaults() -> None:
    s = StageSampling()
    assert [(getattr(s, stage).temperature, getattr(s, stage).max_tokens, getattr(s, stage).presence_penalty)
            for stage in StageSampling.__struct_fields__] == [
        (0.0, 4096, 0.0), (0.0, 48, 0.0), (0.0, 2048, 1.1), (0.0, 1024, 0.0), (0.0, 512, 0.0), (0.1, 512, 0.0),
        (0.0, 512, 0.0), (0.0, 1024, 0.0), (0.0, 160, 0.0), (0.0, 64, 0.0)]
