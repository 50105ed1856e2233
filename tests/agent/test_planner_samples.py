"""What a learning rollout hands the learner on a ``searches`` plan (the embedded default's form): the plan
and replan tokens written under their regex, as the policy's samples, with the regex, the sampler's
log-prob of each token and the adapter version that sampled them; and the raw texts the format reward
reads (a fake engine: pure logic only)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from mia_engine.agent.llm import with_policy_logprobs
from mia_engine.agent.loop import ResearchAgent, ResearchRequest
from mia_engine.agent.plan_searches import plan_searches_regex
from mia_engine.agent.rewards import format_reward, rollout_reward
from mia_engine.config.agent import AgentConfig
from mia_engine.config.tools import ToolsConfig
from mia_engine.engines.client import CompletionDelta, ModelCard, SamplingOptions, TokenLogprob
from mia_engine.learner.ttl import rollout_samples
from mia_engine.tools.registry import Tools
from tests.agent.test_loop import (
    SEARCH_PLAN, FakeClient, FakeMemory, TitledSearch, _evidence_or_call, fake_ids, searches_script)

VERSION = 3


@dataclass
class SamplingClient(FakeClient):
    """``FakeClient`` serving the Planner's adapter version ``VERSION``, and a log-prob of −(i + 1)/10 for
    the i-th token of each completion whose options ask for them."""

    def models(self) -> list[ModelCard]:
        return [ModelCard("planner", "role", "tiny", VERSION), ModelCard("executor", "role", "tiny", 1)]

    async def generate(self, model: str, prompt_ids: list[int], options: SamplingOptions, request_id: str, *,
                       stream: bool, images: list | None = None) -> AsyncIterator[list[CompletionDelta]]:
        async for deltas in super().generate(model, prompt_ids, options, request_id, stream=stream, images=images):
            yield [msgspec.structs.replace(d, logprobs=None if options.logprobs is None else [
                TokenLogprob("t", -(i + 1) / 10) for i in range(len(d.token_ids))]) for d in deltas]


def learning_agent(script, **config: object) -> tuple[ResearchAgent, SamplingClient]:
    client = SamplingClient(script)
    agent_config = msgspec.structs.replace(AgentConfig(), plan_form="searches", answer_from="evidence", **config)
    return ResearchAgent(client, FakeMemory(), Tools(ToolsConfig(), local=TitledSearch()), agent_config), client


async def test_searches_plans_are_the_policys_samples_with_their_regex_logprobs_and_version() -> None:
    agent, client = learning_agent(searches_script(_evidence_or_call), max_replans=0, workflow_summary="extractive")
    result = await agent.research(ResearchRequest("q", ground_truth=["Seine"], num_rollouts=2, learn=True))
    (plan_options,) = [o for m, o in client.options if m == "planner"]
    regex = plan_searches_regex(2, AgentConfig().regex.max_query_chars)
    assert plan_options.regex == regex and plan_options.logprobs == 0
    plan = fake_ids(SEARCH_PLAN)
    for rollout in result.rollouts:
        tokens = rollout.trajectory.planner
        assert tokens is not None and tokens.completion_ids == plan and tokens.completion_mask == [1] * len(plan)
        assert [(s.start, s.end, s.regex) for s in tokens.segments] == [(0, len(plan), regex)]
        assert tokens.logprobs == [-(i + 1) / 10 for i in range(len(plan))]
        assert tokens.policy_version == VERSION
    samples = rollout_samples(result.rollouts, "g")
    assert [(s.start, s.end, s.regex) for s in samples[0].grammar_spans] == [(0, len(plan), regex)]
    assert samples[0].old_logprobs == result.rollouts[0].trajectory.planner.logprobs
    assert samples[0].policy_version == VERSION


async def test_a_replan_under_its_regex_is_a_sample_and_template_tokens_have_no_logprob() -> None:
    replan = "Search: Seine\nSearch: Paris river\n"
    base = searches_script(_evidence_or_call, reflection="yes")

    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        return replan if model == "planner" and "new searches for the agent" in prompt else base(model, prompt, options)

    agent, client = learning_agent(script, first_query="question", max_replans=1, max_turns=5)
    result = await agent.research(ResearchRequest("Which river flows through Paris?", ground_truth=["Seine"],
                                                  learn=True))
    tokens = result.rollouts[0].trajectory.planner
    regex = plan_searches_regex(2, AgentConfig().regex.max_query_chars)
    assert [s.regex for s in tokens.segments] == [regex, None, regex]  # plan, free reflection, replan
    sampled = [i for i, m in zip(tokens.completion_ids, tokens.completion_mask) if m]
    assert sampled == [*fake_ids(SEARCH_PLAN), *fake_ids("yes"), *fake_ids(replan)]
    assert all(math.isnan(lp) == (m == 0) for lp, m in zip(tokens.logprobs, tokens.completion_mask))
    assert all(o.logprobs == 0 for m, o in client.options if m == "planner")


async def test_the_format_reward_reads_the_raw_plan_with_its_thinking() -> None:
    """A plan whose think block never closes: the loop shows the Executor and memory its visible part
    (``Rollout.plan``, balanced), but the format reward reads the raw generation and fails it."""
    raw_plan = "<think>which river" + SEARCH_PLAN
    base = searches_script(_evidence_or_call, reflection="no")

    def script(model: str, prompt: str, options: SamplingOptions) -> str:
        return raw_plan if model == "planner" and "choose the searches" in prompt else base(model, prompt, options)

    agent, _ = learning_agent(script, max_replans=1)
    rollout = (await agent.research(ResearchRequest("q", ground_truth=["Seine"], learn=True))).rollouts[0]
    assert rollout.trajectory.planner_texts is not None and rollout.trajectory.planner_texts.plan == raw_plan
    assert format_reward(rollout.plan, rollout.trajectory.reflection) == 1.0  # the stripped text passes
    balanced = msgspec.structs.replace(rollout, trajectory=msgspec.structs.replace(
        rollout.trajectory, planner_texts=msgspec.structs.replace(rollout.trajectory.planner_texts,
                                                                  plan="<think>which river</think>" + SEARCH_PLAN)))
    weights = agent.config.rewards
    assert rollout_reward(balanced, weights) - rollout_reward(rollout, weights) == weights.format


def test_the_engines_logprobs_are_asked_only_where_they_are_the_sampling_policys() -> None:
    """vLLM's returned log-probs are before temperature and penalties: at temperature 1 with none they are
    the policy's (asked); otherwise the learner must score the old policy itself (not asked)."""
    plain = SamplingOptions(temperature=1.0, max_tokens=8)
    assert with_policy_logprobs(plain).logprobs == 0
    for other in (dict(temperature=0.7), dict(presence_penalty=1.1), dict(top_p=0.9), dict(top_k=20),
                  dict(repetition_penalty=1.2), dict(min_p=0.05), dict(logit_bias={3: 1.0})):
        assert with_policy_logprobs(msgspec.structs.replace(plain, **other)).logprobs is None, other
