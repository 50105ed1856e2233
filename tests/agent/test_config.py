"""Defaults are the paper's / the reference's numbers; invalid values fail at conversion."""

from __future__ import annotations

import msgspec
import pytest

from mia_engine.agent.config import AgentConfig
from mia_engine.tools.config import ToolsConfig


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
    assert config.reviewer.temperature == 0.1 and config.grader.temperature == 0.0
    assert config.executor.presence_penalty == 1.1
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
