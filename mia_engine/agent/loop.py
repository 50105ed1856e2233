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
from .admission import check_fits, check_images
from .answer_choice import ClosedBookAnswer, ask_closed_book
from ..engines.client import EngineClient, RoleClient
from ..config.agent import AgentConfig
from .executor_run import Emit, evidence_texts, ignore_progress
from .llm import Completion, complete, complete_ids, sampling_options, with_policy_logprobs, with_room_for
from .model_text import strip_think
from .plan_decisions import parse_plan_choice, plan_choice_schema
from .records import Rollout, Timings, Trajectory
from .rewards import group_advantages, rollout_reward, select_memories
from .rollout import PlanSample, RolloutQuestion, RolloutRunner
from .stages import StageObserver, StageTimer
from .strategies import choose_strategies
from ..memory.entries import SummarisedRollout
from ..tools.calls import truncate_words
from ..tools.registry import Tools

if TYPE_CHECKING:
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
    closed_book: str | None = None
    """The Manager's answer without tools (``agent.answer_choice``; None when not asked)."""


class ResearchAgent:
    """Answers questions with the Planner, Executor, Manager roles, the memory store and the tools."""

    def __init__(self, client: EngineClient, memory: MemoryService, tools: Tools, config: AgentConfig,
                 on_learn: OnLearn | None = None, stages: StageObserver | None = None) -> None:
        self.client = client
        self.memory = memory
        self.config = config
        self.on_learn = on_learn
        """Receives each learning question's judged rollouts (the test-time learner)."""
        self.stages = StageTimer(stages)
        """Times every stage for ``stages`` (the server's metrics) and each request's ``timings``."""
        self.strategies = choose_strategies(config, tools)
        """What the loop does where the config departs from the paper (chosen once, here)."""
        self.runner = RolloutRunner(client, tools, config, self.stages, self.strategies)
        self._rng = random.Random(config.seed)

    def check_images(self) -> None:
        """Refuse image questions (``QuestionRejected``) when a role that must see the image cannot."""
        check_images(self.client, self.config.roles)

    async def check(self, request: ResearchRequest) -> None:
        """Refuse, before any work, a request this agent cannot research (``QuestionRejected``, one
        sentence): an image it cannot see, a question or gold answers too long for its roles' contexts."""
        if request.image is not None:
            self.check_images()
        await check_fits(self.client, self.config.roles, request.question, request.ground_truth)

    async def research(self, request: ResearchRequest, emit: Emit | None = None) -> ResearchResult:
        """One question through the paper's stages (MIA.md): caption an image → retrieve memories → plan
        (G samples) → route → execute all G (ReAct, reflect, replan) → judge and reward → memory → learn;
        with the ``closed_book`` answer choice the Manager answers the question alone meanwhile, and each
        rollout's answer is chosen between its own and that one before the judge."""
        q = _Question(request, emit or ignore_progress, self.stages)
        closed_book = self._ask_closed_book(q)
        try:
            caption = await self._caption(q)
            memories, used_ids, replay = await self._retrieve(q, caption)
            plan_prompt, completions = await self._plan(q, memories, caption, replay)
            plans = [strip_think(c.after_thinking) if c is not None else "" for c in completions]
            q.emit("plans", {"num_plans": len(plans)})
            chosen = await self._route(q, plans)
            rollouts = await self._execute(q, plan_prompt, completions, plans)
            rollouts, candidate = await self._choose(q, rollouts, closed_book)
        finally:
            if closed_book is not None:
                closed_book.cancel()
        rollouts = await self._judge(q, rollouts)
        new_ids = await self._remember(q, caption, rollouts, used_ids, rollouts[chosen])
        await self._learn(q, rollouts)
        answer = rollouts[chosen].trajectory.final_answer
        return ResearchResult(answer if answer and answer.strip() else NO_ANSWER, chosen, rollouts, used_ids,
                              new_ids, q.timings, caption, candidate)

    # ---- the stages, in order ------------------------------------------------------------------

    def _ask_closed_book(self, q: _Question) -> asyncio.Task[ClosedBookAnswer | None] | None:
        """The closed-book candidate, asked at once beside the other stages (``strategies.choice``); None
        when the config does not ask it, for the plain-ReAct baseline and for an image question."""
        request = q.request
        if not (self.strategies.choice.is_closed_book and request.use_planner and request.image is None):
            return None
        return asyncio.create_task(self._closed_book(q))

    async def _closed_book(self, q: _Question) -> ClosedBookAnswer | None:
        """The Manager's answer to the question alone, no tools, with its tokens' log-probs (None when it
        says nothing or the question does not fit its context)."""
        with q.clock("closed_book"):
            completion = await ask_closed_book(self.client, self.config, q.request.question, affinity_key=q.affinity)
        answer = ClosedBookAnswer.of(completion) if completion is not None else None
        return answer if answer is not None and answer.text else None

    async def _caption(self, q: _Question) -> str | None:
        """An image question's caption by the captioner (the Manager): it keys retrieval, goes into the
        plan prompt and is stored with the workflows. None for a text question."""
        if q.request.image is None:
            return None
        text = prompts.CAPTION.render(max_words=self.config.caption_max_words)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        with q.clock("caption"):
            (caption,) = await complete(self.client.role(self.config.roles.captioner), messages,
                                        sampling_options(self.config.sampling.caption), images=[q.request.image],
                                        keep_thinking=False)
            caption = truncate_words(strip_think(caption).strip(), self.config.caption_max_words)
        q.emit("caption", {"caption": caption})
        return caption

    async def _retrieve(self, q: _Question, caption: str | None) -> tuple[str, list[str], str | None]:
        """(the Planner's memory block, the ids shown, a verified plan to replay or None)."""
        if not (q.request.use_memory and q.request.use_planner):
            return prompts.NO_MEMORIES, [], None
        with q.clock("retrieve"):
            result = await self.memory.search(q.request.question, caption=caption or None)
        positives = [(h.entry.question, h.entry.workflow_summary) for h in result.positives]
        negatives = [(h.entry.question, h.entry.workflow_summary) for h in result.negatives]
        used = [h.entry.id for h in (*result.positives, *result.negatives)]
        return prompts.render_memories(positives, negatives), used, self.strategies.replay.pick(result.positives)

    async def _plan(self, q: _Question, memories: str, caption: str | None,
                    replay: str | None) -> tuple[list[int], list[Completion | None]]:
        """(the Planner's prompt ids, the G plans): one request with n = G, in the plan form's words and
        regex (``strategies.plan``); at inference a verified ``replay`` is written instead (``_written``).
        Exploring, each plan comes with the sampler's log-prob of its every token (the learner's old
        policy). Without the Planner (plain ReAct), no plans."""
        request = q.request
        if not request.use_planner:
            return [], [None] * request.num_rollouts
        ask = self.strategies.plan.request(request.question, memories, caption, has_image=request.image is not None)
        planner = self.client.role(self.config.roles.planner)
        if replay is not None and not request.is_exploring:
            with q.clock("plan"):
                prompt_ids = await planner.render_chat([{"role": "user", "content": ask.text}])
                written = await _written(planner, self.strategies.plan.replay_text(replay))
            return prompt_ids, [written] * request.num_rollouts
        options = sampling_options(self.config.sampling.planner, n=request.num_rollouts, regex=ask.regex,
                                   affinity_key=q.affinity)
        if request.is_exploring:
            options = with_policy_logprobs(msgspec.structs.replace(
                options, temperature=self.config.planner_rollout_temperature))
            q.planner_version = self._planner_version()
        with q.clock("plan"):
            prompt_ids = await planner.render_chat([{"role": "user", "content": ask.text}])
            completions = await complete_ids(planner, prompt_ids, with_room_for(options, ask.min_tokens))
        return prompt_ids, list(completions)

    def _planner_version(self) -> int | None:
        """The Planner adapter version serving now (None: the Planner has none), read just before its G plans
        are sampled: an update published meanwhile makes them one version newer than this, never older, so
        the learner's staleness bound (``learner.max_sample_staleness``) errs on the safe side."""
        planner = self.config.roles.planner
        return next((card.adapter_version for card in self.client.models() if card.id == planner), None)

    async def _route(self, q: _Question, plans: list[str]) -> int:
        """The Router picks p* among the G plans with Meta Plan Memory examples of similar questions."""
        with q.clock("route"):
            chosen = await self._pick_plan(q.request.question, plans) if q.request.use_planner else 0
        q.emit("plan_chosen", {"index": chosen, "plan": truncate_words(plans[chosen], 80)})
        return chosen

    async def _execute(self, q: _Question, plan_prompt: list[int], completions: list[Completion | None],
                       plans: list[str]) -> list[Rollout]:
        """All G plans executed concurrently, each with its reflection and at most one replan."""
        request = q.request
        question = RolloutQuestion(request.question, request.data_id, request.image, q.affinity, request.is_exploring,
                                   q.planner_version)
        with q.clock("execute"):
            runs = await asyncio.gather(*(self.runner.run(question, PlanSample(plan_prompt, c, plan), i, q.emit)
                                          for i, (c, plan) in enumerate(zip(completions, plans))))
        return [Rollout(plan, trajectory, timings=Timings(execute_s=ex, reflect_s=rf))
                for plan, (trajectory, ex, rf) in zip(plans, runs)]

    async def _choose(self, q: _Question, rollouts: list[Rollout],
                      closed_book: asyncio.Task[ClosedBookAnswer | None] | None) -> tuple[list[Rollout], str | None]:
        """(the rollouts, each answer, first and final, chosen between its own and the closed-book
        candidate by ``strategies.choice``; the candidate's text): unchanged when it was not asked."""
        if closed_book is None:
            return rollouts, None
        candidate = await closed_book
        choose = self.strategies.choice.choose
        chosen = []
        for i, rollout in enumerate(rollouts):
            t = rollout.trajectory
            evidence = evidence_texts(t.observations)
            final = choose(q.request.question, t.final_answer, candidate, evidence)
            first = choose(q.request.question, t.first_answer, candidate, evidence) if t.did_replan else final
            q.emit("answer_chosen", {"rollout": i, "source": final.source, "answer": final.answer})
            trajectory = msgspec.structs.replace(
                t, first_answer=first.answer, final_answer=final.answer, answer_source=final.source,
                own_answer=t.final_answer if final.source == "closed_book" else None)
            chosen.append(msgspec.structs.replace(rollout, trajectory=trajectory))
        return chosen, candidate.text if candidate is not None else None

    async def _judge(self, q: _Question, rollouts: list[Rollout]) -> list[Rollout]:
        """Every rollout judged (with ground truth, or learning without it), rewarded, and its group
        advantage computed; unchanged on the plain inference path."""
        if q.request.ground_truth is None and not q.request.learn:
            return rollouts
        with q.clock("judge"):
            rollouts = list(await asyncio.gather(*(self._judge_one(q.request, r) for r in rollouts)))
        rollouts = _with_rewards(rollouts, self.config)
        q.emit("judged", {"verdicts": [r.verdict.label if r.verdict else None for r in rollouts]})
        return rollouts

    async def _remember(self, q: _Question, caption: str | None, rollouts: list[Rollout], used_ids: list[str],
                        chosen: Rollout) -> list[str]:
        """The memory stage: only a request that asked to learn writes memory."""
        if not (q.request.learn and q.request.use_memory):
            return []
        with q.clock("consolidate"):
            return await self._consolidate(q.request.question, caption, rollouts, used_ids, chosen)

    async def _learn(self, q: _Question, rollouts: list[Rollout]) -> None:
        """The judged rollouts to the test-time learner (a GRPO update of the Planner)."""
        if q.request.learn and self.on_learn is not None and q.request.use_planner:
            with q.clock("learn"):
                await self.on_learn(rollouts)

    # ---- helpers of the stages -----------------------------------------------------------------

    async def _pick_plan(self, question: str, plans: list[str]) -> int:
        """The Router's pick (the first plan when there is one, or when its prompt is too long)."""
        if len(plans) <= 1:
            return 0
        hits = await self.memory.search_meta_plans(question)
        examples = prompts.render_router_examples(
            [(h.pair.question, h.pair.successful_plan, h.pair.failed_plan) for h in hits])
        text = prompts.ROUTER.render(examples=examples, question=question, plans=prompts.render_plans(plans),
                                     num_plans=len(plans))
        schema = plan_choice_schema(len(plans)) if self.config.structured_judges else None
        options = sampling_options(self.config.sampling.router, json_schema=schema)
        try:
            (choice,) = await complete(self.client.role(self.config.roles.router),
                                       [{"role": "user", "content": text}], options, keep_thinking=False)
        except ValueError:  # a prompt too long for the router: fall back to the first plan
            return 0
        return parse_plan_choice(choice, len(plans))

    async def _judge_one(self, request: ResearchRequest, rollout: Rollout) -> Rollout:
        """The verdict on the final answer (and on the first, when a replan changed it): graded against
        the ground truth (``strategies.supervised_judge``), else by the reviewers and the Area Chair."""
        t = rollout.trajectory
        start = time.perf_counter()
        if request.ground_truth is not None:
            grader = self.strategies.supervised_judge
            verdict = await judge.judge_supervised(self.client, grader, request.question, request.ground_truth,
                                                   t.final_answer)
            first = verdict
            if t.did_replan and t.first_answer != t.final_answer:
                first = await judge.judge_supervised(self.client, grader, request.question, request.ground_truth,
                                                     t.first_answer)
        else:
            verdict = await self.strategies.unsupervised_judge.judge(self.client, request.question, t,
                                                                     t.final_answer)
            first = verdict
        timings = msgspec.structs.replace(rollout.timings, judge_s=time.perf_counter() - start)
        return msgspec.structs.replace(rollout, verdict=verdict, first_verdict=first, timings=timings)

    async def _consolidate(self, question: str, caption: str | None, rollouts: list[Rollout], used_ids: list[str],
                           chosen: Rollout) -> list[str]:
        """Memory counters of what was retrieved, then the shortest success and one failure
        (``select_memories``), written as workflow memories (``strategies.workflow``), and a Meta Plan
        pair when both exist."""
        if used_ids and chosen.verdict is not None:
            await self.memory.record_outcome(used_ids, chosen.verdict.is_correct)
        picked = select_memories(rollouts, self._rng)
        selected = [r for r in picked if r is not None]
        if not selected:
            return []
        summaries = iter(await asyncio.gather(*(self.strategies.workflow.write(self.client, question, r)
                                                 for r in selected)))
        records = tuple(None if r is None else summarised(question, r, next(summaries), self.config.trace_max_words)
                        for r in picked)
        result = await self.memory.consolidate_group(question, records, caption=caption or None)
        return [added.id for added in (result.positive, result.negative) if added is not None]


class _Question:
    """One question on its way through the stages: the request, its progress callback, its stage clock
    and timings, and the replica key its plans and Planner turns share."""

    def __init__(self, request: ResearchRequest, emit: Emit, stages: StageTimer) -> None:
        self.request = request
        self.emit = emit
        self.timings: dict[str, float] = {}
        """Seconds per stage (``ResearchResult.timings``)."""
        self.clock = stages.for_request(self.timings)
        self.affinity = uuid.uuid4().hex
        """One replica for the G plans and every Planner turn that continues them."""
        self.planner_version: int | None = None
        """The Planner adapter version its plans were sampled from (set while exploring)."""


async def _written(planner: RoleClient, plan: str) -> Completion:
    """A replayed plan as the Planner's completion, written in its tokenizer's tokens rather than generated:
    forcing the text through structured outputs would compile a grammar per stored plan in the engine (and
    keep it in its cache) to decode what is known already. The Planner's conversation continues from these
    tokens (``PlannerTranscript``); nothing is learned from a plan at inference."""
    return Completion(plan, await planner.encode(plan))


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
