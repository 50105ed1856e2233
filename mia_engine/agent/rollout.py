"""One rollout: the Executor's ReAct loop under a plan, then the Planner's reflection and at most one
replan, after which the Executor continues from its own trajectory (MIA.md, "One research query"):

    execute under the plan → answer → reflect → (replan → execute under the replan → answer)

Where a config departs from the paper (a plan of searches, fixed turns, an answer read off the
evidence), the ``strategies`` chosen once from it decide; this module reads none of those fields.
Every generation goes straight to the engine (no HTTP inside the process); tool calls of all
concurrent rollouts meet in the tools' micro-batcher, so G rollouts of many questions cost one
encoder forward and one FAISS search per batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import msgspec

from . import prompts
from ..config.agent import AgentConfig
from .executor_run import ExecutorRun, ask_for_the_answer, continue_with, record, search_calls, start_run, written_turn
from .llm import ChatClient, Completion, complete, complete_ids, sampling_options, with_room_for
from .model_text import strip_think
from .plan_decisions import YES_NO_REGEX, parse_yes_no
from .planner_transcript import PlannerTranscript
from .records import Trajectory
from .stages import StageTimer
from .strategies import Strategies, choose_strategies
from .turns import ExecutorTurn, parse_executor_turn
from ..engines.client import SamplingOptions
from ..tools.calls import Observation, ToolCall, truncate_words
from ..tools.registry import ToolContext, Tools

Emit = Callable[[str, dict], None]
"""Progress callback: (stage, details), e.g. ("tool_call", {"rollout": 0, "name": "search", ...})."""
T = TypeVar("T")


class Course(NamedTuple):
    """How the Executor runs under one plan."""

    max_turns: int
    """Its turn budget."""
    answer_last: bool = True
    """The cap's last turn is the answer-only one (``TurnPolicy.is_answer_only``)."""
    is_pinned: bool = False
    """Every turn is fixed, so the loop writes the turns instead of generating them."""


class RolloutRunner:
    """Runs rollouts for one engine client, tool set and agent config (shared by all questions)."""

    def __init__(self, client: ChatClient, tools: Tools, config: AgentConfig, stages: StageTimer | None = None,
                 strategies: Strategies | None = None) -> None:
        self.client = client
        self.tools = tools
        self.config = config
        self.stages = stages or StageTimer()
        self.strategies = strategies or choose_strategies(config, tools)

    async def run(self, question: str, plan_prompt: list[int], plan_completion: Completion | None, plan: str,
                  index: int, emit: Emit, data_id: str = "", *, explore: bool = False,
                  affinity: str | None = None, image: Any = None) -> tuple[Trajectory, float, float]:
        """(trajectory, executor seconds, reflection seconds) of one plan (``plan``: its visible text, as the
        loop stripped it from ``plan_completion``); without a completion (None) the
        Executor runs plain ReAct: no guide, no reflection. ``explore``: the Planner's reflection and
        replan are sampled from the policy as the learner scores them (the rollout temperature,
        unconstrained), not greedily. ``affinity``: the question's replica key; the Planner's turns use it
        (they continue the G-plan request's prefix), the Executor's turns add the rollout index.
        ``image``: the question's image: the Executor sees it and is offered image-to-image search."""
        has_plan = plan_completion is not None
        planner = PlannerTranscript(plan_prompt, plan_completion.token_ids if plan_completion else [],
                                    is_sampled=self.strategies.plan.is_policy_sample)
        context = ToolContext(data_id, image=image)
        run = self._start(question, plan, index, affinity, image)
        course = self._course(run, plan if has_plan else None)
        first_answer, execute_s = await _timed(self._execute(run, course, context, index, emit))
        reflection, replan, reflect_s = "", "", 0.0
        if self.config.max_replans > 0 and has_plan:
            (reflection, replan), reflect_s = await _timed(
                self._reflect(question, planner, run, first_answer, index, emit, explore))
        final_answer, replan_turn = first_answer, len(run.turns) if replan else -1
        if replan:
            final_answer, more_s = await _timed(self._follow(run, course, replan, context, index, emit))
            execute_s += more_s
        trajectory = Trajectory(run.turns, run.observations, first_answer, final_answer, reflection, replan,
                                bool(replan), replan_turn, run.num_tool_calls, run.num_successful_tool_calls,
                                planner.tokens())
        emit("answer", {"rollout": index, "answer": final_answer})
        return trajectory, execute_s, reflect_s

    def _start(self, question: str, plan: str, index: int, affinity: str | None, image: Any) -> ExecutorRun:
        """The Executor's prompt (tools, question, the plan as its guide) and the queries fixed up front."""
        schemas = self.tools.schemas(with_image=image is not None)
        prompt = prompts.render_executor_prompt(schemas, question, plan or None)
        run = start_run(question, prompt, image, affinity, index)
        run.fixed_queries = self.strategies.turns.first_queries(question)
        return run

    def _course(self, run: ExecutorRun, plan: str | None) -> Course:
        """How the Executor runs under ``plan`` (None: plain ReAct). A plan that pins searches adds them to
        the fixed queries and cuts the budget to them (plus an answer turn when the Executor answers);
        answered from the evidence, every turn is then pinned."""
        if plan is None or not self.strategies.plan.pins_searches:
            return Course(self.config.max_turns)
        run.fixed_queries += self.strategies.plan.searches(plan)
        answer_last = self.strategies.answer.is_executor_answer
        num_turns = len(run.fixed_queries) + int(self.strategies.turns.starts_with_image_search(run)) + answer_last
        return Course(max(1, min(self.config.max_turns, num_turns)), answer_last, is_pinned=not answer_last)

    async def _execute(self, run: ExecutorRun, course: Course, context: ToolContext, index: int,
                       emit: Emit) -> str | None:
        """The Executor's pass under the plan, then the first answer."""
        if course.is_pinned:
            calls = self.strategies.turns.pinned_calls(run)[:course.max_turns]
            await self._run_pinned(run, context, index, emit, calls)
        else:
            await self._react(run, context, index, emit, course.max_turns, answer_last=course.answer_last)
        return await self._answer(run, index, emit)

    async def _follow(self, run: ExecutorRun, course: Course, replan: str, context: ToolContext, index: int,
                      emit: Emit) -> str | None:
        """The pass under the replan, then the final answer. Pinned: the replan's searches not made yet,
        written like the plan's, whose passages the answer reads first. Otherwise the Executor continues
        its own conversation with the revised plan, on a turn budget of its own."""
        if course.is_pinned:
            latest_from = len(run.turns)
            queries = [q for q in self.strategies.plan.searches(replan) if q not in run.fixed_queries]
            run.fixed_queries += queries
            await self._run_pinned(run, context, index, emit, search_calls(queries))
            return await self._answer(run, index, emit, latest_from=latest_from)
        continue_with(run, replan)
        await self._react(run, context, index, emit, self.config.replan_max_turns or self.config.max_turns)
        return await self._answer(run, index, emit)

    async def _answer(self, run: ExecutorRun, index: int, emit: Emit, *, latest_from: int = 0) -> str | None:
        """The trajectory's answer: the Executor's own, or the one its answer strategy asks for
        (``strategies.answer``); the Executor's own when that call fails or says nothing."""
        own = run.last_answer()
        request = self.strategies.answer.request(run, latest_from)
        if request is None:
            return own
        messages, options = request
        try:
            with self.stages("evidence_answer"):
                (answer,) = await complete(self.client, self.config.roles.executor, messages, options,
                                           images=run.images)
        except ValueError as err:
            emit("executor_stopped", {"rollout": index, "detail": str(err)})
            return own
        return strip_think(answer).strip() or own

    async def _react(self, run: ExecutorRun, context: ToolContext, index: int, emit: Emit, max_turns: int, *,
                     answer_last: bool = True) -> None:
        """Think → tool call or answer, until an answer, a turn without a call, or the turn cap;
        ``answer_last``: the cap's last turn is the answer-only one (``force_final_answer``)."""
        for turn_index in range(max_turns):
            is_last = answer_last and turn_index == max_turns - 1
            options = self._turn_options(run, is_last=is_last)
            if self.strategies.turns.is_answer_only(is_last):
                ask_for_the_answer(run)
            try:
                with self.stages("execute_turn"):
                    (text,) = await complete(self.client, self.config.roles.executor, run.messages, options,
                                             images=run.images)
            except ValueError as err:  # a full context (or a request the engine refused) ends the trajectory
                emit("executor_stopped", {"rollout": index, "detail": str(err)})
                return
            turn = parse_executor_turn(text)
            observation = await self._observe(run, turn, context, index, emit)
            record(run, turn, observation)
            if observation is None:
                return

    def _turn_options(self, run: ExecutorRun, *, is_last: bool) -> SamplingOptions:
        """The Executor's sampling, under the turn policy's regex, with room for the longest turn it allows."""
        turns = self.strategies.turns
        options = sampling_options(self.config.sampling.executor, stop=list(self.config.executor_stop),
                                   regex=turns.regex(run, is_last=is_last), affinity_key=run.affinity)
        return with_room_for(options, turns.max_chars(run))

    async def _run_pinned(self, run: ExecutorRun, context: ToolContext, index: int, emit: Emit,
                          calls: list[ToolCall]) -> None:
        """Turns that are pinned whole (a ``searches`` plan answered from the evidence: the Executor has no
        free turn, and only the thinking would be generated, which nothing reads) are written here, not
        generated: their calls run at once (one search batch), in order in the trajectory. Generating
        them would cost a structured-output compile per query (the think block's bounded repeat) and
        the decoding, for the same searches."""
        turns = [written_turn(call) for call in calls]
        observations = await asyncio.gather(*(self._observe(run, turn, context, index, emit) for turn in turns))
        for turn, observation in zip(turns, observations):
            record(run, turn, observation)

    async def _observe(self, run: ExecutorRun, turn: ExecutorTurn, context: ToolContext, index: int,
                       emit: Emit) -> Observation | None:
        """The tool result that follows a turn; None when the turn ends the loop."""
        if turn.tool_call is None:
            if turn.tool_call_error is None:
                return None
            return Observation(f"Error: {turn.tool_call_error}", False)
        emit("tool_call", {"rollout": index, "name": turn.tool_call.name, "arguments": turn.tool_call.arguments})
        with self.stages("tool_call"):
            observation = await self.tools.call(turn.tool_call, context, max_words=self.config.tool_response_max_words)
        run.num_tool_calls += 1
        run.num_successful_tool_calls += int(observation.is_success)
        emit("observation", {"rollout": index, "is_success": observation.is_success,
                             "text": truncate_words(observation.text, 60)})
        return observation

    async def _reflect(self, question: str, planner: PlannerTranscript, run: ExecutorRun, answer: str | None,
                       index: int, emit: Emit, explore: bool) -> tuple[str, str]:
        """(raw yes/no, replan text or ""): the Planner reads the trace and may revise its plan once.

        Its conversation continues in token space from the plan exactly as sampled, so the reflection and
        the replan are conditioned on the Planner's own tokens, as the learner will score them; when
        exploring they are sampled as the learner assumes (rollout temperature, no constraint). ``answer``:
        the answer the trace led to, which the answer strategy may show after the trace."""
        trace = prompts.render_trace(question, run.turns, run.observations, self.config.trace_max_words)
        trace += self.strategies.answer.trace_note(answer)
        sampling = self.config.sampling.planner
        temperature = self.config.planner_rollout_temperature if explore else None
        regex = YES_NO_REGEX if self.config.structured_judges and not explore else None
        decision_options = msgspec.structs.replace(
            sampling_options(sampling, regex=regex, temperature=temperature, affinity_key=run.planner_affinity),
            max_tokens=min(sampling.max_tokens, self.config.reflection_max_tokens))
        with self.stages("reflect"):
            decision = await self._planner_turn(planner, prompts.REFLECTION.render(trace=trace), decision_options)
        if decision is None:
            return "", ""
        if not parse_yes_no(decision):
            return decision, ""
        replan = await self._replan(planner, run, temperature)
        if not replan:
            return decision, ""
        emit("replan", {"rollout": index, "replan": truncate_words(replan, 80)})
        return decision, replan

    async def _replan(self, planner: PlannerTranscript, run: ExecutorRun, temperature: float | None) -> str:
        """The revised plan in the plan's form (``strategies.plan``), its thinking stripped; "" when none.
        One written under a regex is context, not the policy's sample (like such a plan)."""
        request = self.strategies.plan.replan_request()
        options = sampling_options(self.config.sampling.planner, temperature=temperature, regex=request.regex,
                                   affinity_key=run.planner_affinity)
        with self.stages("replan"):
            replan = await self._planner_turn(planner, request.text, with_room_for(options, request.min_tokens),
                                              is_sampled=request.regex is None)
        return strip_think(replan) if replan is not None else ""

    async def _planner_turn(self, planner: PlannerTranscript, user_text: str, options: SamplingOptions, *,
                            is_sampled: bool = True) -> str | None:
        """One more Planner turn after ``user_text``; None when the context is full or the engine refuses.
        ``is_sampled``: its tokens are the policy's own samples (else context only, like a regex-written plan)."""
        model = self.config.roles.planner
        try:
            prompt = await self.client.extend_chat(model, planner.ids(), user_text)
            (completion,) = await complete_ids(self.client, model, prompt, options)
        except ValueError:
            return None
        planner.append(prompt, completion.token_ids, is_sampled=is_sampled)
        return completion.text


async def _timed(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result and the seconds it took."""
    start = time.perf_counter()
    result = await work
    return result, time.perf_counter() - start
