"""The Executor loop on the paper's path (``structured_executor = false``, configs/8xgpu.toml) against the
reference's (ECNU-SII/MIA ``react_agent.py``): the one forced answer at the context limit, and a last turn
without ``<answer>`` read whole as the answer; the structured path does neither."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest

from mia_engine.agent import prompts
from mia_engine.agent.loop import NO_ANSWER, ResearchAgent, ResearchRequest
from mia_engine.config.agent import AgentConfig
from mia_engine.config.tools import ToolsConfig
from mia_engine.tools.registry import Tools
from tests.agent.test_loop import ANSWER, CALL, GLUE, FakeClient, FakeMemory, FakeSearch, message_text, role_script

PAPER = {"structured_executor": False, "force_final_answer": False}
STRUCTURED = {"structured_executor": True, "force_final_answer": False}
REQUEST = prompts.CONTEXT_FULL_ANSWER.render()


@dataclass
class SizedFakeClient(FakeClient):
    """``FakeClient`` whose prompts are as long as the whole conversation (a token per character) and whose
    engine has a context of ``context`` tokens."""

    context: int = 100_000

    def max_model_len(self, model: str) -> int:
        return self.context

    async def render_chat(self, model: str, messages: list[dict]) -> list[int]:
        last = await super().render_chat(model, messages)
        earlier = sum(len(message_text(m["content"])) for m in messages[:-1])
        return [0] * earlier + GLUE + last  # the fake's script still reads the last user message


def agent_with(executor, context: int, **config: object) -> tuple[ResearchAgent, SizedFakeClient]:
    client = SizedFakeClient(role_script(executor=executor), context=context)
    tools = Tools(ToolsConfig(), local=FakeSearch())
    return ResearchAgent(client, FakeMemory(), tools, msgspec.structs.replace(AgentConfig(), **config)), client


def searches_until_asked(prompt: str) -> str:
    """An Executor that never stops searching by itself, and answers the final-answer request."""
    return ANSWER if prompt == REQUEST else CALL


def executor_prompts(client: SizedFakeClient) -> list[str]:
    return [prompt for model, prompt in client.calls if model == "executor"]


@pytest.mark.parametrize("path", ["paper", "structured"])
async def test_a_full_context_gets_the_final_answer_request_on_the_paper_path_only(path: str) -> None:
    """Reference (``react_agent.py``, after every turn): past 110·1024 tokens the last message becomes a
    request for the final answer, one more call is made, its ``<answer>`` is the prediction and the run
    returns (no reflection). Here: past ``executor_max_context_share`` of ``max_model_len``."""
    config = PAPER if path == "paper" else STRUCTURED
    # a context that the conversation passes after the first search: 0.88 of it is under what one
    # search leaves in the conversation, and the first prompt alone fits
    first_search = await _tokens_after_first_search(config)
    context = int(first_search / 0.88) - 1
    agent, client = agent_with(searches_until_asked, context, max_turns=5, **config)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    trajectory = result.rollouts[0].trajectory
    reflections = [p for m, p in client.calls if m == "planner" and "Reply with exactly one word" in p]
    if path == "paper":
        assert executor_prompts(client) == [executor_prompts(client)[0], REQUEST]  # in place of the tool response
        assert result.answer == "Seine" and trajectory.final_answer == "Seine"
        assert len(trajectory.turns) == 2 and trajectory.num_tool_calls == 1
        assert trajectory.observations[-1] is None  # the forced turn ends the trajectory
        assert reflections == []  # the reference returns at once: no reflection, no replan
    else:
        assert REQUEST not in executor_prompts(client)
        assert len(trajectory.turns) == 5 and trajectory.num_tool_calls == 5  # to the turn cap, as before
        assert result.answer == NO_ANSWER and len(reflections) == 1


async def _tokens_after_first_search(config: dict) -> int:
    """The fake conversation's length before the Executor's second turn (its prompt, first turn, tool
    response), measured with a context large enough never to fill."""
    agent, client = agent_with(searches_until_asked, 10**9, max_turns=2, max_replans=0, **config)
    lengths: list[int] = []
    render = client.render_chat

    async def recording(model: str, messages: list[dict]) -> list[int]:
        ids = await render(model, messages)
        if model == "executor":
            lengths.append(len(ids) - len(GLUE))
        return ids

    client.render_chat = recording  # type: ignore[method-assign]
    await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert lengths[0] < int(lengths[1] / 0.88) - 1  # the first prompt fits the context the tests pick
    return lengths[1]


async def test_the_forced_turn_is_read_whole_and_its_tool_call_not_run() -> None:
    """Reference: a forced reply without ``<answer>...</answer>`` is the prediction whole."""
    first_search = await _tokens_after_first_search(PAPER)
    reply = '<think>still unsure</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["x"]}}'
    agent, client = agent_with(lambda p: reply if p == REQUEST else CALL, int(first_search / 0.88) - 1,
                               max_turns=5, max_replans=0, **PAPER)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    trajectory = result.rollouts[0].trajectory
    assert result.answer == reply.strip() and trajectory.num_tool_calls == 1


@pytest.mark.parametrize(("last_turn", "answer"), [
    ("<think>It is the Seine.</think>\nThe Seine.", "<think>It is the Seine.</think>\nThe Seine."),
    ("<think>It is the Seine.</think>\n<answer>Seine", "Seine"),  # unclosed: the rest after the tag
])
async def test_a_last_turn_without_answer_tags_is_the_answer_on_the_paper_path(last_turn: str, answer: str) -> None:
    """Reference (``react_agent.py``, after its loop): the prediction is the text inside ``<answer>``,
    else the whole last message; a structured rollout has no answer then."""
    executor = lambda p: last_turn if p.startswith("<tool_response>") else CALL  # noqa: E731
    paper, _ = agent_with(executor, 10**9, max_replans=0, **PAPER)
    assert (await paper.research(ResearchRequest("Which river flows through Paris?"))).answer == answer
    structured, _ = agent_with(executor, 10**9, max_replans=0, **STRUCTURED)
    assert (await structured.research(ResearchRequest("Which river flows through Paris?"))).answer == NO_ANSWER


async def test_at_the_turn_cap_the_paper_path_forces_nothing() -> None:
    """Reference: at its call limit the prediction is a fixed "Sorry, ..." (no answer), unless the context
    is also full; the last turn's tool call is not read as an answer."""
    agent, client = agent_with(searches_until_asked, 10**9, max_turns=3, max_replans=0, **PAPER)
    result = await agent.research(ResearchRequest("Which river flows through Paris?"))
    assert result.answer == NO_ANSWER and len(result.rollouts[0].trajectory.turns) == 3
    assert REQUEST not in executor_prompts(client)
