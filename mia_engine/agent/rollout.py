"""One rollout: the Executor's ReAct loop under a plan, then the Planner's reflection and at most one
replan, after which the Executor continues from its own trajectory (MIA.md, "One research query").

Every generation goes straight to the engine (no HTTP inside the process); tool calls of all
concurrent rollouts meet in the tools' micro-batcher, so G rollouts of many questions cost one
encoder forward and one FAISS search per batch.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from . import prompts
from .config import AgentConfig
from ..engines.client import SamplingOptions
from .llm import ChatClient, Completion, complete, complete_ids, sampling_options
from .model_text import strip_think
from .plan_decisions import YES_NO_REGEX, parse_yes_no
from .plan_searches import parse_plan_searches, plan_searches_chars, plan_searches_regex
from .records import PlannerTokens, Trajectory
from .stages import StageTimer
from .turns import CALL_CLOSE, CALL_OPEN, ExecutorTurn, executor_turn_regex, parse_executor_turn
from ..tools.calls import Observation, ToolCall, truncate_words
from ..tools.registry import IMAGE_SEARCH, SEARCH, ToolContext, Tools

Messages = list[dict[str, Any]]
Emit = Callable[[str, dict], None]
"""Progress callback: (stage, details), e.g. ("tool_call", {"rollout": 0, "name": "search", ...})."""

TURN_OVERHEAD_CHARS = 160
"""Tags, newlines and the JSON skeleton of a structured turn, with room to spare (about 100 are used)."""
EVIDENCE_TOOLS = ("search", IMAGE_SEARCH)
"""Tools whose successful results the evidence answer reads (passages; titles of similar images)."""
ANSWER_BLOCK = re.compile(r"<answer>.*?(</answer>|$)", re.DOTALL)
"""An ``<answer>`` and its body (to the end when unclosed): stripped from the turn a replan continues."""


@dataclass
class _Run:
    """A trajectory being built: the Executor's conversation and its parsed turns."""

    messages: Messages
    question: str = ""
    turns: list[ExecutorTurn] = field(default_factory=list)
    observations: list[Observation | None] = field(default_factory=list)
    num_tool_calls: int = 0
    num_successful_tool_calls: int = 0
    affinity: str | None = None
    """Replica key of this rollout's Executor turns (its growing prefix stays on one replica)."""
    planner_affinity: str | None = None
    """Replica key of the Planner's reflection and replan (the replica that sampled the plan)."""
    images: list[Any] = field(default_factory=list)
    """The question's image, sent with every Executor turn (its first message holds the image part)."""
    fixed_queries: list[str] = field(default_factory=list)
    """The queries of the first text searches, in order, each pinned by its turn's regex."""

    def last_answer(self) -> str | None:
        """The ``<answer>`` of the last turn; None when the trajectory ended without one (malformed
        output, turn cap, full context), which the user sees as "no answer was found"."""
        return self.turns[-1].answer if self.turns and self.turns[-1].tool_call is None else None


class RolloutRunner:
    """Runs rollouts for one engine client, tool set and agent config (shared by all questions)."""

    def __init__(self, client: ChatClient, tools: Tools, config: AgentConfig, stages: StageTimer | None = None) -> None:
        self.client = client
        self.tools = tools
        self.config = config
        self.stages = stages or StageTimer()
        limits = config.regex
        regex_limits = dict(max_think_chars=limits.max_think_chars, max_answer_chars=limits.max_answer_chars,
                            max_query_chars=limits.max_query_chars, max_queries=limits.max_queries)
        self._turn_regexes = {(allow, with_image): executor_turn_regex(tools.names(with_image=with_image),
                                                                       allow_answer=allow, **regex_limits)
                              for allow in (True, False) for with_image in (True, False)}
        self._answer_regex = executor_turn_regex([], **regex_limits)

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
        # a plan written under the searches regex is not a sample of the policy the learner scores
        planner = _PlannerTranscript(plan_prompt, plan_completion.token_ids if plan_completion else [],
                                     is_sampled=self.config.plan_form != "searches")
        context = ToolContext(data_id, image=image)
        with_image = image is not None
        executor_prompt = prompts.render_executor_prompt(self.tools.schemas(with_image=with_image), question,
                                                         plan or None)
        content: str | list[dict[str, str]] = executor_prompt
        if with_image:
            content = [{"type": "image"}, {"type": "text", "text": executor_prompt}]
        run = _Run([{"role": "user", "content": content}], question,
                   affinity=f"{affinity}/{index}" if affinity else None, planner_affinity=affinity,
                   images=[image] if with_image else [])
        run.fixed_queries = [question] if self.config.first_query == "question" else []
        max_turns, answer_last = self.config.max_turns, True
        runs_plan_searches = self.config.plan_form == "searches" and plan_completion is not None
        if runs_plan_searches:
            # the Executor runs the plan's searches, then answers (or, answering from the evidence, stops)
            run.fixed_queries += parse_plan_searches(plan, self.config.max_plan_searches)
            answer_last = self.config.answer_from != "evidence"
            num_turns = len(run.fixed_queries) + int(self._is_image_first(run)) + int(answer_last)
            max_turns = max(1, min(max_turns, num_turns))
        start = time.perf_counter()
        is_pinned = runs_plan_searches and not answer_last
        if is_pinned:
            await self._run_pinned(run, context, index, emit, self._pinned_calls(run)[:max_turns])
        else:
            await self._react(run, context, index, emit, max_turns, answer_last=answer_last)
        first_answer = await self._answer(run, index, emit)
        execute_s = time.perf_counter() - start
        reflection, replan, replan_turn, reflect_s = "", "", -1, 0.0
        if self.config.max_replans > 0 and plan_completion is not None:
            reflect_start = time.perf_counter()
            reflection, replan = await self._reflect(question, planner, run, first_answer, index, emit, explore)
            reflect_s = time.perf_counter() - reflect_start
        final_answer = first_answer
        if replan:
            replan_turn = len(run.turns)
            more_start = time.perf_counter()
            if is_pinned:  # the replan's new searches, written like the plan's; the latest are read first
                queries = [q for q in parse_plan_searches(replan, self.config.max_plan_searches)
                           if q not in run.fixed_queries]
                run.fixed_queries += queries
                await self._run_pinned(run, context, index, emit, _search_calls(queries))
                final_answer = await self._answer(run, index, emit, latest_from=replan_turn)
            else:
                _continue_with(run, replan)
                await self._react(run, context, index, emit, self.config.replan_max_turns or self.config.max_turns)
                final_answer = await self._answer(run, index, emit)
            execute_s += time.perf_counter() - more_start
        trajectory = Trajectory(run.turns, run.observations, first_answer, final_answer, reflection, replan,
                                bool(replan), replan_turn, run.num_tool_calls, run.num_successful_tool_calls,
                                planner.tokens())
        emit("answer", {"rollout": index, "answer": final_answer})
        return trajectory, execute_s, reflect_s

    async def _answer(self, run: _Run, index: int, emit: Emit, *, latest_from: int = 0) -> str | None:
        """The trajectory's answer: the Executor's own, or (``answer_from = "evidence"``) one read off the
        passages its searches returned; ``latest_from``: the turn where the latest round of searches
        (a replan's) begins, whose passages are read first (the evidence is cut to a word budget, and
        a replan searches for what the first round lacked)."""
        own = run.last_answer()
        observations = [*run.observations[latest_from:], *run.observations[:latest_from]]
        evidence = [o.text for o in observations if o is not None and o.is_success and o.tool in EVIDENCE_TOOLS]
        if self.config.answer_from != "evidence" or not evidence:
            return own
        passages = truncate_words("\n".join(dict.fromkeys(evidence)), self.config.evidence_max_words)
        text = prompts.EVIDENCE_ANSWER.render(passages=passages, question=run.question)
        # one line, no constraint: a bounded free-text regex costs xgrammar seconds to compile under load
        options = sampling_options(self.config.answer, stop=["\n"])
        content: str | list[dict[str, str]] = [{"type": "image"}, {"type": "text", "text": text}] if run.images else text
        try:
            with self.stages("evidence_answer"):
                (answer,) = await complete(self.client, self.config.roles.executor,
                                           [{"role": "user", "content": content}], options, images=run.images)
        except ValueError as err:
            emit("executor_stopped", {"rollout": index, "detail": str(err)})
            return own
        return strip_think(answer).strip() or own

    async def _react(self, run: _Run, context: ToolContext, index: int, emit: Emit, max_turns: int, *,
                     answer_last: bool = True) -> None:
        """Think → tool call or answer, until an answer, a turn without a call, or the turn cap;
        ``answer_last``: the cap's last turn is the answer-only one (``force_final_answer``)."""
        for turn_index in range(max_turns):
            is_last = answer_last and turn_index == max_turns - 1
            options = self._turn_options(run, is_last=is_last)
            if self._answer_only(is_last) and run.turns and run.messages[-1]["role"] == "user":
                # the answer-only turn: say so (and restate the question), appended to the last tool response
                last = run.messages[-1]
                run.messages[-1] = {**last, "content": last["content"] + "\n\n"
                                    + prompts.FINAL_ANSWER.render(question=run.question)}
            try:
                with self.stages("execute_turn"):
                    (text,) = await complete(self.client, self.config.roles.executor, run.messages, options,
                                             images=run.images)
            except ValueError as err:  # a full context (or a request the engine refused) ends the trajectory
                emit("executor_stopped", {"rollout": index, "detail": str(err)})
                return
            turn = parse_executor_turn(text)
            observation = await self._observe(run, turn, context, index, emit)
            _record(run, turn, observation)
            if observation is None:
                return

    def _pinned_calls(self, run: _Run) -> list[ToolCall]:
        """The calls of a rollout whose turns are all fixed: the image search first (``first_image_search``),
        then the text searches of ``run.fixed_queries`` in order."""
        return ([ToolCall(IMAGE_SEARCH, {"img_idx": "0"})] if self._is_image_first(run) else []) + \
            _search_calls(run.fixed_queries)

    async def _run_pinned(self, run: _Run, context: ToolContext, index: int, emit: Emit,
                          calls: list[ToolCall]) -> None:
        """Turns that are pinned whole (a ``searches`` plan answered from the evidence: the Executor has no
        free turn, and only the thinking would be generated, which nothing reads) are written here, not
        generated: their calls run at once (one search batch), in order in the trajectory. Generating
        them would cost a structured-output compile per query (the think block's bounded repeat) and
        the decoding, for the same searches."""
        turns = [_written_turn(call) for call in calls]
        observations = await asyncio.gather(*(self._observe(run, turn, context, index, emit) for turn in turns))
        for turn, observation in zip(turns, observations):
            _record(run, turn, observation)

    def _answer_only(self, is_last: bool) -> bool:
        """The turn cap's last turn, when it may only answer (``force_final_answer``)."""
        return is_last and self.config.structured_executor and self.config.force_final_answer

    def _turn_options(self, run: _Run, *, is_last: bool) -> SamplingOptions:
        regex = None
        if self._answer_only(is_last):
            regex = self._answer_regex
        elif self.config.structured_executor:
            regex = self._fixed_turn_regex(run) or self._turn_regexes[
                run.num_tool_calls >= self.config.min_tool_calls, bool(run.images)]
        options = sampling_options(self.config.executor, stop=list(self.config.executor_stop), regex=regex,
                                   affinity_key=run.affinity)
        if regex is None:
            return options
        # A turn the regex bounds must never be cut by the token budget (a cut tool call parses as an
        # error and wastes the turn): a token is at least one character, so the longest text the regex
        # allows is a budget that always suffices.
        return msgspec.structs.replace(options, max_tokens=max(options.max_tokens or 0, self._turn_chars(run)))

    def _fixed_turn_regex(self, run: _Run) -> str | None:
        """The regex of a turn the config fixes, if this is one: an image question's first turn is the
        image search (``first_image_search``); then the text searches of ``run.fixed_queries`` in order
        (the question itself with ``first_query = "question"``, a ``searches`` plan's queries)."""
        limits = self.config.regex
        image_first = self._is_image_first(run)
        if image_first and not run.turns:
            return executor_turn_regex([IMAGE_SEARCH], allow_answer=False, max_think_chars=limits.max_think_chars)
        index = len(run.turns) - int(image_first)
        if 0 <= index < len(run.fixed_queries) and SEARCH in self.tools.names():
            return executor_turn_regex([SEARCH], max_think_chars=limits.max_think_chars,
                                       fixed_query=run.fixed_queries[index])
        return None

    def _is_image_first(self, run: _Run) -> bool:
        return self.config.first_image_search and bool(run.images)

    def _turn_chars(self, run: _Run) -> int:
        """The longest Executor turn the structured-output regexes allow (tags and JSON included)."""
        limits = self.config.regex
        query = max((len(json.dumps(q, ensure_ascii=False)) for q in [run.question, *run.fixed_queries]), default=0)
        body = max(limits.max_answer_chars, limits.max_queries * (limits.max_query_chars + 4), query, 300)
        return limits.max_think_chars + body + TURN_OVERHEAD_CHARS

    async def _observe(self, run: _Run, turn: ExecutorTurn, context: ToolContext, index: int,
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

    async def _reflect(self, question: str, planner: _PlannerTranscript, run: _Run, answer: str | None,
                       index: int, emit: Emit, explore: bool) -> tuple[str, str]:
        """(raw yes/no, replan text or ""): the Planner reads the trace and may revise its plan once.

        Its conversation continues in token space from the plan exactly as sampled, so the reflection and
        the replan are conditioned on the Planner's own tokens, as the learner will score them; when
        exploring they are sampled as the learner assumes (rollout temperature, no constraint). A
        ``searches`` plan's replan is written in the same form, under the same regex, so (like the plan)
        it is context, not the policy's sample. ``answer``: the answer the trace led to, shown after the
        trace when it came from the evidence (it is not one of the Executor's turns)."""
        trace = prompts.render_trace(question, run.turns, run.observations, self.config.trace_max_words)
        if self.config.answer_from == "evidence" and answer:
            trace += prompts.TRACE_ANSWER.render(answer=answer)
        sampling = self.config.planner
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
        options = sampling_options(sampling, temperature=temperature, affinity_key=run.planner_affinity)
        if self.config.plan_form == "searches":
            limits = (self.config.max_plan_searches, self.config.regex.max_query_chars)
            text = prompts.REPLAN_SEARCHES.render(max_searches=limits[0])
            # never cut what the regex allows (a token is at least one character)
            options = msgspec.structs.replace(options, regex=plan_searches_regex(*limits),
                                              max_tokens=max(options.max_tokens or 0, plan_searches_chars(*limits)))
        else:
            text = prompts.REPLAN.render(max_words=self.config.replan_max_words)
        with self.stages("replan"):
            replan = await self._planner_turn(planner, text, options, is_sampled=options.regex is None)
        replan = strip_think(replan) if replan is not None else ""
        if not replan:
            return decision, ""
        emit("replan", {"rollout": index, "replan": truncate_words(replan, 80)})
        return decision, replan

    async def _planner_turn(self, planner: _PlannerTranscript, user_text: str, options: SamplingOptions, *,
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


class _PlannerTranscript:
    """The Planner's conversation of one rollout, in token space, with which tokens it sampled."""

    def __init__(self, prompt_ids: list[int], plan_ids: list[int], *, is_sampled: bool = True) -> None:
        """``is_sampled``: the plan's tokens are the policy's own samples (else they are context only)."""
        self.prompt_ids = list(prompt_ids)
        self.completion_ids = list(plan_ids)
        self.mask = [int(is_sampled)] * len(plan_ids)

    def ids(self) -> list[int]:
        return [*self.prompt_ids, *self.completion_ids]

    def append(self, prompt: list[int], generated: list[int], *, is_sampled: bool = True) -> None:
        """A turn: ``prompt`` extends ``ids()`` by the template's tokens (not the Planner's), then
        ``generated`` (the policy's own samples when ``is_sampled``)."""
        glue = prompt[len(self.prompt_ids) + len(self.completion_ids):]
        self.completion_ids += [*glue, *generated]
        self.mask += [0] * len(glue) + [int(is_sampled)] * len(generated)

    def tokens(self) -> PlannerTokens | None:
        if not any(self.mask) or not self.prompt_ids:
            return None  # a client without token ids (nothing to learn from)
        return PlannerTokens(self.prompt_ids, self.completion_ids, self.mask)


def _record(run: _Run, turn: ExecutorTurn, observation: Observation | None) -> None:
    """A turn and what followed it, in the trajectory and in the Executor's conversation (no tool
    response when the turn ended the loop)."""
    run.turns.append(turn)
    run.observations.append(observation)
    run.messages.append({"role": "assistant", "content": turn.text})
    if observation is not None:
        run.messages.append({"role": "user", "content": prompts.TOOL_RESPONSE.render(text=observation.text)})


def _search_calls(queries: list[str]) -> list[ToolCall]:
    """One search call per query, in order (the turns the loop writes for pinned searches)."""
    return [ToolCall(SEARCH, {"query_list": [query]}) for query in queries]


def _written_turn(call: ToolCall) -> ExecutorTurn:
    """A pinned turn the loop writes for the Executor: the call alone, no thinking, nothing generated
    (``raw`` is empty)."""
    text = f"{CALL_OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"
    return ExecutorTurn("", text, None, call, None, True)


def _continue_with(run: _Run, replan: str) -> None:
    """Keep the Executor's last turn minus its ``<answer>`` and hand it the revised plan (the
    reference's words)."""
    last = run.messages[-1]
    if run.turns and run.turns[-1].tool_call is None and last["role"] == "assistant":
        kept = ANSWER_BLOCK.sub("", last["content"]).strip()
        if kept:
            run.messages[-1] = {**last, "content": kept}
        else:
            run.messages.pop()
    run.messages.append({"role": "user", "content": prompts.REPLAN_CONTINUATION.render(replan=replan)})
