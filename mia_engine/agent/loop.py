"""The research loop for one question, as named stages (MIA.md, "One research query" and
"Test-time learning" steps 1-6):

    retrieve → plan (G samples, one request) → route → execute all G (ReAct + reflect/replan)
    → judge → reward → consolidate

The low-latency path is the same loop with G = 1, greedy sampling, no judge and no consolidation.
A question with an image adds one stage first: the Manager captions the image; the caption keys
retrieval (``text_image`` buckets), goes into the plan prompt and is stored with the workflows, and
the Executor sees the image itself and may search for similar images once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from . import judge, prompts
from .config import AgentConfig
from .llm import ChatClient, Completion, complete, complete_ids, sampling_options
from .model_text import strip_think
from .plan_decisions import parse_plan_choice, plan_choice_schema
from .plan_searches import parse_plan_searches, plan_searches_chars, plan_searches_regex, render_plan_searches
from .records import Rollout, Timings, Trajectory
from .rewards import group_advantages, rollout_reward, select_memories
from .rollout import Emit, RolloutRunner
from .stages import StageObserver, StageTimer
from .turns import regex_literal
from .workflows import extractive_workflow, searches_workflow
from ..memory.entries import SummarisedRollout
from ..tools.calls import truncate_words
from ..tools.registry import Tools

if TYPE_CHECKING:
    from ..memory.handle import MemoryHandle
    from ..memory.service import MemoryService

NO_ANSWER = "No answer was found."

OnLearn = Callable[[list[Rollout]], Awaitable[None]]
"""The judged rollouts of one question (each with its Planner tokens) -> queued for a GRPO update."""


class ResearchRequest(msgspec.Struct, frozen=True):
    question: str
    ground_truth: list[str] | None = None
    """Acceptable answers; with them the judge is supervised."""
    num_rollouts: int = 1
    """G: plans sampled and executed (1 = the low-latency path)."""
    learn: bool = False
    """Judge (unsupervised without ground truth), reward and consolidate memory."""
    data_id: str = ""
    """Key of the question in the image-search cache."""
    use_memory: bool = True
    """Retrieve memories for the plan and (when learning) store workflows; False = no memory at all."""
    use_planner: bool = True
    """False: the Executor alone runs plain ReAct (no plan, no reflection, no Router): a baseline."""
    image: Any = None
    """The question's image, decoded (an RGB ``PIL.Image``), or None for a text question."""

    @property
    def is_exploring(self) -> bool:
        """Plans, reflections and replans are sampled from the policy (G > 1 or learning)."""
        return self.num_rollouts > 1 or self.learn


class ResearchResult(msgspec.Struct):
    answer: str
    chosen: int
    """Index of the plan whose answer is returned (the Router's pick)."""
    rollouts: list[Rollout]
    memory_ids_used: list[str]
    new_memory_ids: list[str]
    timings: dict[str, float]
    """Seconds per stage."""
    caption: str | None = None
    """The Manager's caption of the question's image (None for a text question)."""


class ResearchAgent:
    """Answers questions with the Planner, Executor, Manager roles, the memory store and the tools."""

    def __init__(self, client: ChatClient, memory: MemoryService | MemoryHandle, tools: Tools, config: AgentConfig,
                 on_learn: OnLearn | None = None, stages: StageObserver | None = None) -> None:
        self.client = client
        self.memory = memory
        self.config = config
        self.on_learn = on_learn
        """Receives each learning question's judged rollouts (the test-time learner)."""
        self.stages = StageTimer(stages)
        """Times every stage for ``stages`` (the server's metrics) and each request's ``timings``."""
        self.runner = RolloutRunner(client, tools, config, self.stages)
        self._rng = random.Random(config.seed)

    async def research(self, request: ResearchRequest, emit: Emit | None = None) -> ResearchResult:
        emit = emit or _ignore
        timings: dict[str, float] = {}
        clock = self.stages.for_request(timings)
        caption = None
        if request.image is not None:
            with clock("caption"):
                caption = await self._caption(request.image)
            emit("caption", {"caption": caption})
        memories, used_ids, replay = prompts.NO_MEMORIES, [], None
        if request.use_memory and request.use_planner:
            with clock("retrieve"):
                memories, used_ids, replay = await self._retrieve(request.question, caption)
        plan_prompt: list[int] = []
        completions: list[Completion | None] = [None] * request.num_rollouts
        affinity = uuid.uuid4().hex  # one replica for the G plans and every Planner turn that continues them
        if request.use_planner:
            with clock("plan"):
                plan_prompt, planned = await self._plan(request, memories, caption, affinity,
                                                        None if request.is_exploring else replay)
            completions = list(planned)
        plans = [strip_think(c.text) if c is not None else "" for c in completions]
        emit("plans", {"num_plans": len(plans)})
        with clock("route"):
            chosen = await self._route(request.question, plans) if request.use_planner else 0
        emit("plan_chosen", {"index": chosen, "plan": truncate_words(plans[chosen], 80)})
        with clock("execute"):
            runs = await asyncio.gather(*(
                self.runner.run(request.question, plan_prompt, c, plan, i, emit, request.data_id,
                                explore=request.is_exploring, affinity=affinity, image=request.image)
                for i, (c, plan) in enumerate(zip(completions, plans))))
        rollouts = [Rollout(plan, trajectory, timings=Timings(execute_s=ex, reflect_s=rf))
                    for plan, (trajectory, ex, rf) in zip(plans, runs)]
        new_ids: list[str] = []
        if request.ground_truth is not None or request.learn:
            with clock("judge"):
                rollouts = await self._judge(request, rollouts)
            rollouts = _with_rewards(rollouts, self.config)
            emit("judged", {"verdicts": [r.verdict.label if r.verdict else None for r in rollouts]})
        if request.learn and request.use_memory:  # only a request that asked to learn writes memory
            with clock("consolidate"):
                new_ids = await self._consolidate(request.question, caption, rollouts, used_ids, rollouts[chosen])
        if request.learn and self.on_learn is not None and request.use_planner:
            with clock("learn"):
                await self.on_learn(rollouts)
        answer = rollouts[chosen].trajectory.final_answer
        return ResearchResult(answer if answer and answer.strip() else NO_ANSWER, chosen, rollouts, used_ids,
                              new_ids, timings, caption)

    async def _caption(self, image: Any) -> str:
        """The captioner's (the Manager's) description of the image; its engine takes images (checked at
        admission)."""
        text = prompts.CAPTION.render(max_words=self.config.caption_max_words)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        (caption,) = await complete(self.client, self.config.roles.captioner, messages,
                                    sampling_options(self.config.caption), images=[image])
        return truncate_words(strip_think(caption).strip(), self.config.caption_max_words)

    async def _retrieve(self, question: str, caption: str | None) -> tuple[str, list[str], str | None]:
        """(the Planner's memory block, the ids shown, the plan to replay or None: ``replay_min_similarity``)."""
        result = await self.memory.search(question, caption=caption or None)
        positives = [(h.entry.question, h.entry.workflow_summary) for h in result.positives]
        negatives = [(h.entry.question, h.entry.workflow_summary) for h in result.negatives]
        used = [h.entry.id for h in (*result.positives, *result.negatives)]
        floor = self.config.replay_min_similarity
        replay = next((h.entry.plan for h in result.positives
                       if floor is not None and h.sim >= floor and strip_think(h.entry.plan)), None)
        return prompts.render_memories(positives, negatives), used, replay

    async def _plan(self, request: ResearchRequest, memories: str, caption: str | None, affinity: str,
                    replay: str | None = None) -> tuple[list[int], list[Completion]]:
        """(the Planner's prompt ids, the G plans): one request with n = G. A ``searches`` plan is always
        written under its regex (a small Planner samples that form from its own policy almost never);
        ``replay``: a stored plan the Planner must write exactly (``replay_min_similarity``)."""
        config = self.config
        regex = None
        if config.plan_form == "searches":
            text = prompts.render_plan_searches_prompt(request.question, memories, config.max_plan_searches, caption,
                                                       is_question_searched=config.first_query == "question")
            regex = plan_searches_regex(config.max_plan_searches, config.regex.max_query_chars)
        else:
            max_words = config.planner_max_words if request.image is None else config.planner_max_words_image
            text = prompts.render_plan_prompt(request.question, memories, max_words, caption)
        if replay is not None:
            replay = strip_think(replay)
            if config.plan_form == "searches":
                replay = render_plan_searches(parse_plan_searches(replay, config.max_plan_searches)) or replay
            regex = regex_literal(replay)
        messages = [{"role": "user", "content": text}]
        num = request.num_rollouts
        temperature = config.planner_rollout_temperature if request.is_exploring else None
        options = sampling_options(config.planner, n=num, temperature=temperature, regex=regex, affinity_key=affinity)
        if regex is not None:  # never cut what the regex allows (a token is at least one character)
            longest = plan_searches_chars(config.max_plan_searches, config.regex.max_query_chars)
            longest = max(longest, len(replay)) if replay is not None else longest
            options = msgspec.structs.replace(options, max_tokens=max(options.max_tokens or 0, longest))
        prompt_ids = await self.client.render_chat(self.config.roles.planner, messages)
        return prompt_ids, await complete_ids(self.client, self.config.roles.planner, prompt_ids, options)

    async def _route(self, question: str, plans: list[str]) -> int:
        """The Router (manager role) picks p* with Meta Plan Memory examples of similar questions."""
        if len(plans) <= 1:
            return 0
        hits = await self.memory.search_meta_plans(question)
        examples = prompts.render_router_examples(
            [(h.pair.question, h.pair.successful_plan, h.pair.failed_plan) for h in hits])
        text = prompts.ROUTER.render(examples=examples, question=question, plans=prompts.render_plans(plans),
                                     num_plans=len(plans))
        schema = plan_choice_schema(len(plans)) if self.config.structured_judges else None
        options = sampling_options(self.config.router, json_schema=schema)
        try:
            (choice,) = await complete(self.client, self.config.roles.router, [{"role": "user", "content": text}],
                                       options)
        except ValueError:  # a prompt too long for the router: fall back to the first plan
            return 0
        return parse_plan_choice(choice, len(plans))

    async def _judge(self, request: ResearchRequest, rollouts: list[Rollout]) -> list[Rollout]:
        return list(await asyncio.gather(*(self._judge_one(request, r) for r in rollouts)))

    async def _judge_one(self, request: ResearchRequest, rollout: Rollout) -> Rollout:
        t = rollout.trajectory
        start = time.perf_counter()
        if request.ground_truth is not None:
            verdict = await judge.judge_supervised(self.client, self.config, request.question,
                                                   request.ground_truth, t.final_answer)
            first = verdict
            if t.did_replan and t.first_answer != t.final_answer:
                first = await judge.judge_supervised(self.client, self.config, request.question,
                                                     request.ground_truth, t.first_answer)
        else:
            trace = prompts.render_trace(request.question, t.turns, t.observations, self.config.trace_max_words)
            verdict = await judge.judge_unsupervised(self.client, self.config, request.question, trace,
                                                     t.final_answer)
            first = verdict
        timings = msgspec.structs.replace(rollout.timings, judge_s=time.perf_counter() - start)
        return msgspec.structs.replace(rollout, verdict=verdict, first_verdict=first, timings=timings)

    async def _consolidate(self, question: str, caption: str | None, rollouts: list[Rollout], used_ids: list[str],
                           chosen: Rollout) -> list[str]:
        """Memory counters of what was retrieved, then the shortest success and one failure, summarised
        by the Manager, as workflow memories (and a Meta Plan pair when both exist)."""
        if used_ids and chosen.verdict is not None:
            await self.memory.record_outcome(used_ids, chosen.verdict.is_correct)
        positive, negative = select_memories(rollouts, self._rng)
        selected = [r for r in (positive, negative) if r is not None]
        if not selected:
            return []
        summaries = await asyncio.gather(*(self._summarise(question, r) for r in selected))
        records = [summarised(question, r, summary, self.config.trace_max_words)
                   for r, summary in zip(selected, summaries)]
        result = await self.memory.consolidate_group(question, records, caption=caption or None)
        return [added.id for added in (result.positive, result.negative) if added is not None]

    async def _summarise(self, question: str, rollout: Rollout) -> str:
        if self.config.workflow_summary == "extractive":
            if self.config.plan_form == "searches":
                searches = parse_plan_searches(rollout.plan, self.config.max_plan_searches)
                return searches_workflow(searches, rollout.is_correct)
            return extractive_workflow(rollout.trajectory, rollout.is_correct, self.config.summary_max_words)
        trace = _trajectory_text(question, rollout.trajectory, self.config.trace_max_words)
        text = prompts.WORKFLOW_SUMMARY.render(max_words=self.config.summary_max_words, question=question,
                                               outcome="correct" if rollout.is_correct else "incorrect",
                                               trajectory=trace)
        try:
            (summary,) = await complete(self.client, self.config.roles.manager, [{"role": "user", "content": text}],
                                        sampling_options(self.config.manager))
        except ValueError:
            summary = ""
        return truncate_words(strip_think(summary), self.config.summary_max_words) or rollout.plan[:500] or "-"


def _with_rewards(rollouts: list[Rollout], config: AgentConfig) -> list[Rollout]:
    rewards = [rollout_reward(r, config.rewards) for r in rollouts]
    advantages = group_advantages(rewards, config.advantage_eps)
    return [msgspec.structs.replace(r, reward=rw, advantage=adv) for r, rw, adv in zip(rollouts, rewards, advantages)]


def summarised(question: str, rollout: Rollout, summary: str, max_words: int) -> SummarisedRollout:
    """The memory's view of a judged rollout and the Manager's ``summary`` of it (all consolidation reads
    and stores: plan, summary, verdict, length in Executor turns, trajectory text)."""
    return SummarisedRollout(rollout.plan, summary, rollout.is_correct, len(rollout.trajectory.turns),
                             _trajectory_text(question, rollout.trajectory, max_words))


def _trajectory_text(question: str, trajectory: Trajectory, max_words: int) -> str:
    return prompts.render_trace(question, trajectory.turns, trajectory.observations, max_words)


def _ignore(stage: str, details: dict) -> None:
    return None
