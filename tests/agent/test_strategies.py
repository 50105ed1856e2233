"""The departures from the paper as strategies chosen once (``agent/strategies.py``), and the agent's own
refusal of a question it cannot research (``ResearchAgent.check``)."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest

from mia_engine.agent import strategies as strategies_module
from mia_engine.agent import turn_policy
from mia_engine.agent.admission import QuestionRejected
from mia_engine.agent.answers import EvidenceAnswer, TrajectoryAnswer
from mia_engine.agent.executor_run import ExecutorRun, ignore_progress
from mia_engine.config.agent import AgentConfig
from mia_engine.agent.judge import LLMGrader, StringMatch
from mia_engine.agent.loop import ResearchAgent, ResearchRequest
from mia_engine.agent.plan_forms import ProsePlan, SearchesPlan
from mia_engine.agent.strategies import choose_strategies
from mia_engine.agent.workflows import ExtractiveWorkflow, ManagerSummary, SearchesWorkflow
from mia_engine.config import load_config
from mia_engine.config.tools import ToolsConfig
from mia_engine.tools.registry import ToolContext, Tools
from tests.fakes import RolesByName

DEPARTURES = ("plan_form", "replay_min_similarity", "first_query", "first_image_search", "min_tool_calls",
              "force_final_answer", "answer_from", "workflow_summary", "supervised_judge")
"""The fields that choose a strategy (``config/agent.py``, the departures' block)."""
TOOLS = Tools(ToolsConfig())


def test_the_loop_reads_no_field_that_chooses_a_strategy() -> None:
    """One place chooses: in the agent package only ``strategies.py`` (and the turn policy it builds from
    the config) reads a departure field; the loop, the rollout and the judges call the strategies."""
    package = Path(strategies_module.__file__).parent
    choosers = {Path(strategies_module.__file__).name, Path(turn_policy.__file__).name}
    readers = sorted(f"{path.name}:{node.lineno} config.{node.attr}"
                     for path in package.glob("*.py") if path.name not in choosers
                     for node in ast.walk(ast.parse(path.read_text())) if _reads_config(node, DEPARTURES))
    assert readers == []


def _reads_config(node: ast.AST, fields: tuple[str, ...]) -> bool:
    """``config.<field>`` or ``<anything>.config.<field>``."""
    if not isinstance(node, ast.Attribute) or node.attr not in fields:
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "config") or \
        (isinstance(owner, ast.Attribute) and owner.attr == "config")


def test_each_config_gets_its_strategies() -> None:
    small = choose_strategies(load_config("default").agent, TOOLS)
    assert (type(small.plan), type(small.answer), type(small.workflow), type(small.supervised_judge)) == (
        SearchesPlan, EvidenceAnswer, SearchesWorkflow, StringMatch)
    assert small.replay.min_similarity == 0.95 and small.plan.is_question_searched
    assert (small.turns.is_question_first, small.turns.min_tool_calls, small.turns.is_image_first) == (True, 1, False)
    paper = choose_strategies(load_config("8xgpu").agent, TOOLS)
    assert (type(paper.plan), type(paper.answer), type(paper.workflow), type(paper.supervised_judge)) == (
        ProsePlan, TrajectoryAnswer, ManagerSummary, LLMGrader)
    assert paper.replay.min_similarity is None and paper.describe()["plan"] == "ProsePlan"
    extractive = choose_strategies(AgentConfig(workflow_summary="extractive"), TOOLS)
    assert type(extractive.workflow) is ExtractiveWorkflow  # a prose plan's rollout is written as its steps


def test_8xgpu_runs_the_papers_loop_with_every_departure_off() -> None:
    """configs/8xgpu.toml (the paper's models): the paper's strategy for every concern, and Executor turns as
    the reference generates them: free-form (no regex on any turn) and nothing forced at the turn cap."""
    agent = load_config("8xgpu").agent
    paper = AgentConfig.for_profile("paper")
    fields = (*DEPARTURES, "answer_choice", "unsupervised_judge", "max_replans", "structured_executor")
    assert {f: getattr(agent, f) for f in fields} == {
        **{f: getattr(paper, f) for f in fields}, "structured_executor": False, "force_final_answer": False}
    turns = choose_strategies(agent, TOOLS).turns
    run = ExecutorRun.start("Who wrote Emma?", "prompt", ToolContext(), 0, ignore_progress, affinity=None)
    assert [turns.regex(run, is_last=is_last) for is_last in (False, True)] == [None, None]
    assert not turns.is_answer_only(True) and turns.first_queries("Who wrote Emma?") == []
    structured = choose_strategies(msgspec.structs.replace(agent, structured_executor=True, force_final_answer=True),
                                   TOOLS).turns  # the departures stay available as fields
    assert structured.is_answer_only(True) and structured.regex(run, is_last=False) is not None


class SizedClient(RolesByName):
    """What ``check`` asks an engine client: context lengths, a chat's length in tokens, image support."""

    def __init__(self, max_model_len: int, *, text_only: tuple[str, ...] = ()) -> None:
        self._max_model_len = max_model_len
        self._text_only = text_only

    def max_model_len(self, model: str) -> int:
        return self._max_model_len

    async def render_chat(self, model: str, messages: list[dict]) -> list[int]:
        return [0] * len(messages[0]["content"].split())  # one token a word

    def supports_images(self, model: str) -> bool:
        return model not in self._text_only


def _agent(client: SizedClient, **config: object) -> ResearchAgent:
    return ResearchAgent(client, None, TOOLS, msgspec.structs.replace(AgentConfig(), **config))  # type: ignore[arg-type]


async def test_check_refuses_what_does_not_fit_a_quarter_of_the_smallest_context() -> None:
    agent = _agent(SizedClient(400))  # 100 tokens for the question, 100 for the gold answers
    await agent.check(ResearchRequest("word " * 100, ["gold"] * 100))
    with pytest.raises(QuestionRejected) as info:
        await agent.check(ResearchRequest("word " * 101))
    assert (info.value.field, info.value.code) == ("question", "context_length_exceeded")
    assert str(info.value) == "The question takes 101 tokens; this server's models allow 100."
    with pytest.raises(QuestionRejected) as info:
        await agent.check(ResearchRequest("q", ["gold"] * 101))
    assert info.value.field == "ground_truth"


async def test_check_refuses_an_image_a_role_cannot_see() -> None:
    agent = _agent(SizedClient(400, text_only=("manager",)))  # the captioner is the Manager by default
    await agent.check(ResearchRequest("Which tower?"))  # a text question needs no image support
    with pytest.raises(QuestionRejected) as info:
        await agent.check(ResearchRequest("Which tower?", image=object()))
    assert (info.value.field, info.value.code) == ("image", "images_not_supported")
    assert "`manager` run on a text-only engine" in str(info.value)
    captioning = _agent(SizedClient(400, text_only=("manager",)), roles=msgspec.structs.replace(
        AgentConfig().roles, captioner="captioner"))
    await captioning.check(ResearchRequest("Which tower?", image=object()))
