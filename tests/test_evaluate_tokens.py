"""What ``eval`` counts as generated tokens: every text a model generated, whether or not the learner
trains on it (pure logic; a fake tokenizer that counts words)."""

from __future__ import annotations

from types import SimpleNamespace

from mia_engine.config.agent import AgentConfig
from mia_engine.agent.loop import ResearchResult
from mia_engine.agent.records import PlannerTokens, Rollout, Trajectory
from mia_engine.agent.turns import ExecutorTurn
from mia_engine.evals.evaluate import _generated_tokens
from mia_engine.tools.calls import ToolCall
from tests.fakes import RolesByName


class _Words(RolesByName):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def encode(self, model: str, text: str) -> list[int]:
        self.calls.append((model, text))
        return list(range(len(text.split())))


async def test_a_regex_written_plan_and_the_evidence_answer_count_and_written_turns_do_not() -> None:
    written = ExecutorTurn("", "<tool_call>...</tool_call>", None, ToolCall("search", {"query_list": ["q"]}), None, True)
    generated = ExecutorTurn("<think>a b</think> c", "c", "a b", None, "c", True)
    trajectory = Trajectory([written, generated], [None, None], "Paris is it", "Paris is it",
                            planner=PlannerTokens([1, 2], [3, 4, 5], [0, 0, 0]))  # not the policy's sample
    result = ResearchResult("Paris is it", 0, [Rollout("Search: one two\n", trajectory)], [], [], {})
    agent = AgentConfig(answer_from="evidence")
    roles = _Words()
    services = SimpleNamespace(config=SimpleNamespace(agent=agent), roles=roles)
    total = await _generated_tokens(services, agent.roles.executor, result)
    assert total == 3 + 3 + 3  # plan, the generated turn, the evidence answer
    assert (agent.roles.planner, "Search: one two\n") in roles.calls
    assert all(text for _, text in roles.calls)  # the written turn (raw "") is not encoded
