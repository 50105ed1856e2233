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
from collections.abc import Awaitable
from typing import Any, NamedTuple, TypeVar

import msgspec

from . import prompts
from ..config.agent import AgentConfig
from .answers import answer_lines
from .executor_run import Emit, ExecutorRun, call_text, search_calls, written_turn
from .llm import Completion, complete, complete_ids, sampling_options, with_policy_logprobs, with_room_for
from .model_text import strip_think
from .plan_decisions import YES_NO_REGEX, parse_yes_no
from .planner_transcript import PlannerTranscript
from .records import Trajectory
from .stages import StageTimer
from .strategies import Strategies, choose_strategies
from .turns import ExecutorTurn, fixed_call_turn, parse_executor_turn
from ..engines.client import EngineClient, RoleClient, SamplingOptions
from ..tools.calls import Observation, ToolCall, truncate_words
from ..tools.registry import ToolContext, Tools

T = TypeVar("T")


class RolloutQuestion(NamedTuple):
    """What the G rollouts of one question share."""

    text: str
    data_id: str = ""
    """Key of the question in the image-search cache."""
    image: Any = None
    """The question's image: the Executor sees it and is offered image-to-image search."""
    affinity: str | None = None
    """The question's replica key: the Planner's turns use it (they continue the G-plan request's
    prefix), the Executor's turns add the rollout index."""
    explore: bool = False
    """The Planner's reflection and replan are sampled from the policy as the learner scores them (the
    rollout temperature, unconstrained), not greedily."""
    planner_version: int | None = None
    """Exploring, the Planner adapter version the plans were sampled from (the learner's staleness bound)."""


class PlanSample(NamedTuple):
    """One of the G plans as the Planner sampled it."""

    prompt_ids: list[int]
    """The Planner's prompt, shared by the G plans."""
    completion: Completion | None
    """The plan's completion; None: no Planner, the Executor runs plain ReAct (no guide, no reflection)."""
    text: str
    """Its visible text, as the loop stripped it from ``completion``."""


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

    def __init__(self, client: EngineClient, tools: Tools, config: AgentConfig, stages: StageTimer | None = None,
                 strategies: Strategies | None = None) -> None:
        self.client = client
        self.tools = tools
        self.config = config
        self.stages = stages or StageTimer()
        self.strategies = strategies or choose_strategies(config, tools)

    async def run(self, question: RolloutQuestion, plan: PlanSample, index: int,
                  emit: Emit) -> tuple[Trajectory, float, float]:
        """(trajectory, executor seconds, reflection seconds) of rollout ``index`` under ``plan``; its
        progress goes to ``emit``."""
        has_plan = plan.completion is not None
        # Exploring, a plan is sampled under its form's regex (a replayed one, under its own literal, is an
        # inference plan: never learned from).
        planner = PlannerTranscript(plan.prompt_ids, plan.completion, regex=self.strategies.plan.regex,
                                    policy_version=question.planner_version if question.explore else None)
        run = self._start(question, plan.text, index, emit)
        course = self._course(run, plan.text if has_plan else None)
        first_answer, execute_s = await _timed(self._execute(run, course))
        reflection, replan, reflect_s = "", "", 0.0
        if self.config.max_replans > 0 and has_plan and not run.is_context_full:
            (reflection, replan), reflect_s = await _timed(self._reflect(run, planner, first_answer, question.explore))
        final_answer, replan_turn = first_answer, len(run.turns) if replan else -1
        if replan:
            final_answer, more_s = await _timed(self._follow(run, course, replan))
            execute_s += more_s
        trajectory = Trajectory(run.turns, run.observations, first_answer, final_answer, reflection, replan,
                                bool(replan), replan_turn, run.num_tool_calls, run.num_successful_tool_calls,
                                planner.tokens(), planner.texts if has_plan else None)
        run.emit("answer", {"answer": final_answer})
        return trajectory, execute_s, reflect_s

    def _start(self, question: RolloutQuestion, plan: str, index: int, emit: Emit) -> ExecutorRun:
        """The Executor's prompt (tools, question, the plan as its guide) and the queries fixed up front."""
        schemas = self.tools.schemas(with_image=question.image is not None)
        prompt = prompts.render_executor_prompt(schemas, question.text, plan or None)
        context = ToolContext(question.data_id, image=question.image)
        run = ExecutorRun.start(question.text, prompt, context, index, emit, affinity=question.affinity)
        run.fixed_queries = self.strategies.turns.first_queries(question.text)
        return run

    def _course(self, run: ExecutorRun, plan: str | None) -> Course:
        """How the Executor runs under ``plan`` (None: plain ReAct). A plan that pins searches adds them to
        the fixed queries (those not fixed already: the same search twice finds the same passages) and cuts
        the budget to them (plus an answer turn when the Executor answers); answered from the evidence,
        every turn is then pinned."""
        if plan is None or not self.strategies.plan.pins_searches:
            return Course(self.config.max_turns)
        run.fixed_queries += [q for q in dict.fromkeys(self.strategies.plan.searches(plan)) if q not in run.fixed_queries]
        answer_last = self.strategies.answer.is_executor_answer
        num_turns = len(run.fixed_queries) + int(self.strategies.turns.starts_with_image_search(run)) + answer_last
        return Course(max(1, min(self.config.max_turns, num_turns)), answer_last, is_pinned=not answer_last)

    async def _execute(self, run: ExecutorRun, course: Course) -> str | None:
        """The Executor's pass under the plan, then the first answer."""
        if course.is_pinned:
            await self._run_pinned(run, self.strategies.turns.pinned_calls(run)[:course.max_turns])
        else:
            await self._react(run, course.max_turns, answer_last=course.answer_last)
        return await self._answer(run)

    async def _follow(self, run: ExecutorRun, course: Course, replan: str) -> str | None:
        """The pass under the replan, then the final answer. Pinned: the replan's searches not made yet,
        written like the plan's, whose passages the answer reads first. Otherwise the Executor continues
        its own conversation with the revised plan, on a turn budget of its own."""
        if course.is_pinned:
            latest_from = len(run.turns)
            queries = [q for q in self.strategies.plan.searches(replan) if q not in run.fixed_queries]
            run.fixed_queries += queries
            await self._run_pinned(run, search_calls(queries))
            return await self._answer(run, latest_from=latest_from)
        run.continue_with(replan)
        await self._react(run, self.config.replan_max_turns or self.config.max_turns)
        return await self._answer(run)

    async def _answer(self, run: ExecutorRun, *, latest_from: int = 0) -> str | None:
        """The trajectory's answer: the Executor's own, or the one its answer strategy asks for
        (``strategies.answer``); the Executor's own when that call fails or says nothing."""
        own = run.last_answer(whole_turn=not self.strategies.turns.is_structured)
        request = self.strategies.answer.request(run, latest_from)
        if request is None:
            return own
        messages, options = request
        try:
            with self.stages("evidence_answer"):
                (answer,) = await complete(self.client.role(self.config.roles.executor), messages, options,
                                           images=run.images, keep_thinking=False)
        except ValueError as err:
            run.emit("executor_stopped", {"detail": str(err)})
            return own
        return answer_lines(strip_think(answer)) or own

    async def _react(self, run: ExecutorRun, max_turns: int, *, answer_last: bool = True) -> None:
        """Think → tool call or answer, until an answer, a turn without a call, a full context or the turn
        cap; ``answer_last``: the cap's last turn is the answer-only one (``force_final_answer``). After
        the loop, a full context gets the final-answer request (free-form path only)."""
        role = self.client.role(self.config.roles.executor)
        num_prompt_tokens: int | None = None  # the conversation as last rendered, when it did not change since
        for turn_index in range(max_turns):
            is_last = answer_last and turn_index == max_turns - 1
            options = self._turn_options(run, is_last=is_last)
            fixed = None if self.strategies.turns.is_answer_only(is_last) else self.strategies.turns.fixed_call(run)
            if self.strategies.turns.is_answer_only(is_last):
                run.ask_for_the_answer()
            try:
                with self.stages("execute_turn"):
                    prompt_ids = await role.render_chat(run.messages)
                    if self._is_context_full(run, role, len(prompt_ids)):
                        num_prompt_tokens = len(prompt_ids)
                        break
                    (completion,) = await complete_ids(role, prompt_ids, options, images=run.images)
            except ValueError as err:  # a full context (or a request the engine refused) ends the trajectory
                run.emit("executor_stopped", {"detail": str(err)})
                return
            text = completion.text if fixed is None else fixed_call_turn(completion.text, call_text(fixed))
            turn = parse_executor_turn(text)
            observation = await self._observe(run, turn)
            run.record(turn, observation)
            if observation is None:
                return
        await self._answer_if_context_full(run, role, num_prompt_tokens)

    def _is_context_full(self, run: ExecutorRun, role: RoleClient, num_prompt_tokens: int) -> bool:
        """On the free-form path, after a turn: the rendered conversation has passed
        ``executor_max_context_share`` of the Executor's context (the reference's 110·1024-token check,
        ``react_agent.py``). Structured turns run until the engine refuses a prompt, as before."""
        if self.strategies.turns.is_structured or not run.turns:
            return False
        return num_prompt_tokens > self.config.executor_max_context_share * role.max_model_len()

    async def _answer_if_context_full(self, run: ExecutorRun, role: RoleClient,
                                      num_prompt_tokens: int | None = None) -> None:
        """The reference's one forced answer, which its check after every turn makes (the turn cap's last
        one too): when the context is full (``_is_context_full``), the final-answer request replaces the
        last message and one more turn, as free as the others, ends the trajectory; a tool call it
        writes is not run. Nothing is forced at the turn cap itself. ``num_prompt_tokens``: the length of
        the conversation as it stands, already rendered (None: rendered here)."""
        if self.strategies.turns.is_structured or not run.turns:
            return
        try:
            with self.stages("execute_turn"):
                if num_prompt_tokens is None:
                    num_prompt_tokens = len(await role.render_chat(run.messages))
                if not self._is_context_full(run, role, num_prompt_tokens):
                    return
                run.ask_for_the_answer_at_full_context()
                run.emit("context_full", {"num_prompt_tokens": num_prompt_tokens,
                                          "max_model_len": role.max_model_len()})
                (text,) = await complete(role, run.messages, self._turn_options(run, is_last=False),
                                         images=run.images)
        except ValueError as err:  # the request still does not fit, or the engine refused it
            run.emit("executor_stopped", {"detail": str(err)})
            return
        run.record(parse_executor_turn(text), None)

    def _turn_options(self, run: ExecutorRun, *, is_last: bool) -> SamplingOptions:
        """The Executor's sampling, under the turn policy's regex, with room for the longest turn it allows."""
        turns = self.strategies.turns
        options = sampling_options(self.config.sampling.executor, stop=list(self.config.executor_stop),
                                   regex=turns.regex(run, is_last=is_last), affinity_key=run.affinity)
        return with_room_for(options, turns.max_chars(run))

    async def _run_pinned(self, run: ExecutorRun, calls: list[ToolCall]) -> None:
        """Turns that are pinned whole (a ``searches`` plan answered from the evidence: the Executor has no
        free turn, and only the thinking would be generated, which nothing reads) are written here, not
        generated: their calls run at once (one search batch), in order in the trajectory. Generating
        them would cost the decoding of think blocks, one turn after another, for the same searches."""
        turns = [written_turn(call) for call in calls]
        observations = await asyncio.gather(*(self._observe(run, turn) for turn in turns))
        for turn, observation in zip(turns, observations):
            run.record(turn, observation)

    async def _observe(self, run: ExecutorRun, turn: ExecutorTurn) -> Observation | None:
        """The tool result that follows a turn; None when the turn ends the loop."""
        if turn.tool_call is None:
            if turn.tool_call_error is None:
                return None
            return Observation(f"Error: {turn.tool_call_error}", False)
        run.emit("tool_call", {"name": turn.tool_call.name, "arguments": turn.tool_call.arguments})
        with self.stages("tool_call"):
            observation = await self.tools.call(turn.tool_call, run.context,
                                                max_words=self.config.tool_response_max_words)
        run.count_call(observation)
        run.emit("observation", {"is_success": observation.is_success, "text": truncate_words(observation.text, 60)})
        return observation

    async def _reflect(self, run: ExecutorRun, planner: PlannerTranscript, answer: str | None,
                       explore: bool) -> tuple[str, str]:
        """(raw yes/no, replan text or ""): the Planner reads the trace and may revise its plan once.

        Its conversation continues in token space from the plan exactly as sampled, so the reflection and
        the replan are conditioned on the Planner's own tokens, as the learner will score them; when
        exploring they are sampled as the learner assumes (rollout temperature, no constraint), with the
        sampler's log-prob of each token (the learner's old policy). ``answer``: the answer the trace led
        to, which the answer strategy may show after the trace."""
        trace = prompts.render_trace(run.question, run.turns, run.observations, self.config.trace_max_words)
        trace += self.strategies.answer.trace_note(answer)
        sampling = self.config.sampling.planner
        temperature = self.config.planner_rollout_temperature if explore else None
        regex = YES_NO_REGEX if self.config.structured_judges and not explore else None
        decision_options = msgspec.structs.replace(
            sampling_options(sampling, regex=regex, temperature=temperature, affinity_key=run.planner_affinity),
            max_tokens=min(sampling.max_tokens, self.config.reflection_max_tokens))
        if explore:
            decision_options = with_policy_logprobs(decision_options)
        with self.stages("reflect"):
            completion = await self._planner_turn(planner, prompts.REFLECTION.render(trace=trace), decision_options)
        if completion is None:
            return "", ""
        planner.record_reflection(completion.text)
        decision = completion.after_thinking
        if not parse_yes_no(decision):
            return decision, ""
        replan = await self._replan(planner, run, temperature)
        if not replan:
            return decision, ""
        run.emit("replan", {"replan": truncate_words(replan, 80)})
        return decision, replan

    async def _replan(self, planner: PlannerTranscript, run: ExecutorRun, temperature: float | None) -> str:
        """The revised plan in the plan's form (``strategies.plan``), its thinking stripped; "" when none.
        Exploring (``temperature`` set), with the sampler's log-prob of each token."""
        request = self.strategies.plan.replan_request()
        options = sampling_options(self.config.sampling.planner, temperature=temperature, regex=request.regex,
                                   affinity_key=run.planner_affinity)
        if temperature is not None:
            options = with_policy_logprobs(options)
        with self.stages("replan"):
            completion = await self._planner_turn(planner, request.text, with_room_for(options, request.min_tokens))
        if completion is None:
            return ""
        planner.record_replan(completion.text)
        return strip_think(completion.after_thinking)

    async def _planner_turn(self, planner: PlannerTranscript, user_text: str,
                            options: SamplingOptions) -> Completion | None:
        """One more Planner turn after ``user_text``, recorded in ``planner`` with the regex it was sampled
        under; None when the context is full or the engine refuses."""
        role = self.client.role(self.config.roles.planner)
        try:
            prompt = await role.extend_chat(planner.ids(), user_text)
            (completion,) = await complete_ids(role, prompt, options)
        except ValueError:
            return None
        planner.append(prompt, completion, regex=options.regex)
        return completion


async def _timed(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result and the seconds it took."""
    start = time.perf_counter()
    result = await work
    return result, time.perf_counter() - start
