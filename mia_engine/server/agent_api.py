"""Model ``mia`` on ``/v1/chat/completions``: the research agent behind the OpenAI protocol.

The last user message is the question; extra body fields ``ground_truth``, ``rollouts``, ``learn``
and ``return_trace`` steer the loop. A non-streamed answer carries a ``mia`` object (plans, chosen
plan, tool calls, reflection, verdicts, rewards, memory ids, stage timings); a stream sends one chunk
per stage, with a progress line in ``delta.reasoning_content`` and the event in ``mia``, then the
answer as content.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec

from ..agent.admission import QuestionRejected
from ..agent.handle import AgentUnavailable
from ..agent.loop import ResearchAgent, ResearchRequest, ResearchResult
from ..config import AGENT_MODEL, ServerConfig
from ..engines.client import ContextLengthError
from .chat_messages import message_text
from .errors import BadRequest, ErrorBody, ErrorDetail, Unavailable
from .images import image_param, image_parts, load_images
from .limits import check_question
from .metrics import Metrics
from .openai_bodies import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice,
                            ChunkChoice, Delta)
from .streaming import sse

log = logging.getLogger(__name__)


class AgentSource(Protocol):
    """Where the agent comes from once the engines, memory and tools are up."""

    def is_ready(self) -> bool: ...

    def not_ready_reason(self) -> str: ...

    @property
    def agent(self) -> ResearchAgent:
        """The agent; raises ``AgentUnavailable`` until it is up."""
        ...

    def default_rollouts(self, learn: bool) -> int: ...


class AgentChat:
    def __init__(self, source: AgentSource, config: ServerConfig, metrics: Metrics) -> None:
        self.source = source
        self.config = config
        self.metrics = metrics

    async def research_request(self, request: ChatCompletionRequest) -> ResearchRequest:
        """Validate the agent-specific parts of a chat request (before any work starts); decode its image."""
        if not self.source.is_ready():
            raise Unavailable(self.source.not_ready_reason(), code="engine_not_ready")
        index, message = next(((i, m) for i, m in reversed(list(enumerate(request.messages))) if m.role == "user"),
                              (None, None))
        if message is None:
            raise BadRequest("The research agent needs a user message with the question.", param="messages")
        image = await self._question_image(request, index)
        question = message_text(message).strip()
        if not question:
            raise BadRequest("The question is empty.", param=f"messages[{index}].content")
        check_question(question, f"messages[{index}].content", self.config.limits)
        rollouts = request.rollouts or self.source.default_rollouts(request.learn)
        if rollouts > self.config.limits.max_rollouts:
            raise BadRequest(f"rollouts = {rollouts} is more than this server allows "
                             f"({self.config.limits.max_rollouts}).", param="rollouts")
        truth = [request.ground_truth] if isinstance(request.ground_truth, str) else request.ground_truth
        return ResearchRequest(question, truth, rollouts, request.learn, request.data_id or "", image=image)

    async def _question_image(self, request: ChatCompletionRequest, index: int) -> Any:
        """The question's image (None without one): decoded and checked, and only when the captioner and
        the Executor both take images."""
        parts = image_parts(request.messages)
        if not parts:
            return None
        try:
            self._agent().check_images()
        except QuestionRejected as err:
            raise _bad_request(err, image_param(*parts[0][:2])) from None
        images = await load_images(request.messages, self.config.images)
        stray = [item for item in images if item.message != index]
        if stray:
            raise BadRequest("The research agent takes the image of the question (the last user message) only.",
                             param=stray[0].param)
        return images[0].image

    async def check_fits(self, research: ResearchRequest) -> None:
        """The agent's own refusal of a request it cannot research (``ResearchAgent.check``: a question or
        gold answers too long for its roles' contexts), as a 400 before any work starts."""
        try:
            await self._agent().check(research)
        except QuestionRejected as err:
            raise _bad_request(err) from None

    async def complete(self, request: ChatCompletionRequest, research: ResearchRequest) -> bytes:
        start = time.perf_counter()
        status = "cancelled"
        try:
            result = await self._agent().research(research)
            status = "ok"
        except ContextLengthError as err:  # the research grew past a context after all: the client's input
            status = "error"
            raise BadRequest(str(err), param="messages", code="context_length_exceeded") from None
        finally:
            self._record(status, start)
        body = ChatCompletion(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), AGENT_MODEL,
                              [Choice(0, AssistantMessage(content=result.answer), "stop")], None,
                              mia=trace(result, full=request.return_trace))
        return msgspec.json.encode(body)

    async def stream(self, request: ChatCompletionRequest, research: ResearchRequest) -> AsyncIterator[bytes]:
        """Stage events as they happen; cancelling the stream (client gone) cancels the research."""
        chunk_id, created, encode = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), msgspec.json.encode
        events: asyncio.Queue[tuple[str, dict] | None] = asyncio.Queue()
        start, status = time.perf_counter(), "cancelled"

        def emit(stage: str, details: dict) -> None:
            events.put_nowait((stage, details))

        task = asyncio.ensure_future(self._agent().research(research, emit))
        task.add_done_callback(lambda _: events.put_nowait(None))
        yield sse(encode(ChatCompletionChunk(chunk_id, created, AGENT_MODEL,
                                             [ChunkChoice(0, Delta(role="assistant", content=""))])))
        try:
            while (event := await events.get()) is not None:
                stage, details = event
                delta = Delta(reasoning_content=progress_line(stage, details))
                yield sse(encode(ChatCompletionChunk(chunk_id, created, AGENT_MODEL, [ChunkChoice(0, delta)],
                                                     mia={"stage": stage, **_jsonable(details)})))
            result = task.result()
            status = "ok"
            final = ChunkChoice(0, Delta(content=result.answer), "stop")
            yield sse(encode(ChatCompletionChunk(chunk_id, created, AGENT_MODEL, [final],
                                                 mia=trace(result, full=request.return_trace))))
        except Exception:  # the research failed after the stream started: report it in-band (details: the log)
            status = "error"
            log.exception("research failed after its stream started")
            yield sse(encode(ErrorBody(ErrorDetail("research failed (details are in the server log)",
                                                   "server_error"))))
        finally:
            if not task.done():
                task.cancel()
            self._record(status, start)
        yield b"data: [DONE]\n\n"

    def _agent(self) -> ResearchAgent:
        try:
            return self.source.agent
        except AgentUnavailable as err:
            raise Unavailable(str(err), code="engine_not_ready") from None

    def _record(self, status: str, start: float) -> None:
        self.metrics.requests.labels(AGENT_MODEL, status).inc()
        self.metrics.latency.labels(AGENT_MODEL).observe(time.perf_counter() - start)


def _bad_request(err: QuestionRejected, image: str | None = None) -> BadRequest:
    """The agent's refusal as a 400 naming the request's parameter (``image``: the image part's)."""
    params = {"question": "messages", "ground_truth": "ground_truth", "image": image}
    return BadRequest(str(err), param=params.get(err.field), code=err.code)


def progress_line(stage: str, details: dict) -> str:
    rollout = f"[rollout {details['rollout']}] " if "rollout" in details else ""
    shown = {k: v for k, v in details.items() if k != "rollout"}
    return f"{rollout}{stage}: {msgspec.json.encode(_jsonable(shown)).decode()}\n"


def trace(result: ResearchResult, *, full: bool) -> dict[str, Any]:
    """The ``mia`` object: what the agent did, per rollout; turns and observations only when ``full``."""
    rollouts = []
    for r in result.rollouts:
        t = r.trajectory
        item: dict[str, Any] = {
            "plan": r.plan, "first_answer": t.first_answer, "final_answer": t.final_answer,
            "answer_source": t.answer_source, "own_answer": t.own_answer,
            "reflection": t.reflection, "replan": t.replan, "did_replan": t.did_replan,
            "tool_calls": [{"name": turn.tool_call.name, "arguments": turn.tool_call.arguments,
                            "result": obs.text if obs else None, "is_success": obs.is_success if obs else False}
                           for turn, obs in zip(t.turns, t.observations) if turn.tool_call is not None],
            "verdict": msgspec.to_builtins(r.verdict) if r.verdict else None,
            "reward": r.reward, "advantage": r.advantage, "timings": msgspec.to_builtins(r.timings),
        }
        if full:
            item["turns"] = [turn.text for turn in t.turns]
            item["observations"] = [obs.text if obs else None for obs in t.observations]
        rollouts.append(item)
    return {"chosen": result.chosen, "rollouts": rollouts, "memory_ids_used": result.memory_ids_used,
            "new_memory_ids": result.new_memory_ids, "timings": result.timings, "caption": result.caption,
            "closed_book": result.closed_book}


def _jsonable(value: Any) -> Any:
    return msgspec.to_builtins(value, str_keys=True, enc_hook=str)
