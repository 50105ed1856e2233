"""What a client sees while the research agent starts: the index build's progress, and nothing private."""

from __future__ import annotations

from mia_engine.agent.handle import AgentHandle
from mia_engine.config import load_config
from mia_engine.tools.corpus import index_root
from mia_engine.tools.search import LocalSearch
from mia_engine.server.health_api import waiting_line


def test_progress_of_the_index_build_is_public_while_it_runs() -> None:
    handle = AgentHandle(load_config("tiny", {}))
    assert handle.progress() == "preparing the search index"
    handle.index_progress.start(10_033)
    handle.index_progress.advance(2_560)
    assert handle.progress().startswith("building the search index: 2560/10033 passages (25%), about ")
    assert handle.progress() in handle.not_ready_reason()  # the 503 of model `mia` says the same
    assert waiting_line("agent_not_ready", handle) == f"agent is not ready ({handle.progress()})"
    handle.fail("the sentence encoder failed to load: OSError at /secret/path")
    assert handle.progress() == "" and waiting_line("agent_not_ready", handle) == "agent is not ready"


async def test_a_tool_that_fails_to_start_shows_callers_its_error_class_not_its_path(caplog) -> None:
    """The 503 of model ``mia`` reaches any key holder: the missing corpus's path stays in the log."""
    secret = "/srv/private-corpus/passages.jsonl"
    config = load_config("tiny", {"tools.corpus": secret})
    handle = AgentHandle(config)
    try:
        LocalSearch.from_config(config.tools, None, index_root(config), True, handle.index_progress)
    except FileNotFoundError as err:  # what the composition root's tool build meets (services.py)
        handle.tools_failed(err)
    reason = handle.not_ready_reason()
    assert reason == "the research agent's tools failed to start (FileNotFoundError; see the server log)"
    assert secret in caplog.text
