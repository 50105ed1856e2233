"""Async scheduling on CPU (``engines.*.cpu.async_scheduling``, on by default): the served engine schedules
its next step while the model runs the current one. Checked against a server with it off: the same greedy
text for the same requests, and constrained text that stays well formed when many requests share steps."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from openai import AsyncOpenAI, OpenAI

from tests.conftest import THREAD_LEARNER, ServerHandle, _openai, launch_tiny, server_fixture

REGEX = r"\[(yes|no)\] [a-z]{3,8}( [a-z]{2,6}){0,3}"


sync_server = server_fixture("sync_server", launch_tiny("sync_server", "--engines.tiny.cpu.async_scheduling=false",
                                                          THREAD_LEARNER))


def _greedy(client: OpenAI, model: str, nonce: str, constrained: bool) -> str:
    """A prompt no earlier request shared (no prefix-cache hit on either server: a hit changes the
    prefill's shapes, and a bf16 model's numbers with them)."""
    extra = {"structured_outputs": {"regex": REGEX}} if constrained else {}
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"{nonce}: which river is the longest?"}],
        max_tokens=24, temperature=0, extra_body=extra).choices[0].message.content


def test_the_served_engine_schedules_ahead_and_the_other_does_not(tiny_server: ServerHandle,
                                                                   sync_server: ServerHandle) -> None:
    assert "schedules ahead" in tiny_server.log_path.read_text(errors="replace")
    assert "schedules ahead" not in sync_server.log_path.read_text(errors="replace")


@pytest.mark.parametrize(("model", "constrained"), [("executor", True), ("planner", False), ("manager", True)])
def test_one_request_at_a_time_gives_the_same_greedy_text(tiny_server: ServerHandle, sync_server: ServerHandle,
                                                          model: str, constrained: bool) -> None:
    """A request decoded alone: with async scheduling each step's input token comes from the previous
    step's output on the worker's side, not through the scheduler; the text must not change."""
    for _ in range(2):
        nonce = uuid.uuid4().hex
        ahead = _greedy(_openai(tiny_server, 120), model, nonce, constrained)
        assert ahead == _greedy(_openai(sync_server, 120), model, nonce, constrained)
        if constrained:
            assert re.fullmatch(REGEX, ahead), ahead


async def test_concurrent_constrained_requests_stay_well_formed(tiny_server: ServerHandle) -> None:
    """Many grammars in one step: a request's mask for step N+1 needs its token of step N, which the
    scheduler does not have yet when it schedules ahead (vLLM defers those masks)."""
    async with AsyncOpenAI(base_url=tiny_server.openai_url, api_key=tiny_server.api_key, max_retries=0,
                           timeout=120) as client:
        async def one(i: int) -> str:
            out = await client.chat.completions.create(
                model=("executor", "planner", "manager")[i % 3],
                messages=[{"role": "user", "content": f"Question {i} {uuid.uuid4().hex}?"}],
                max_tokens=24, temperature=1.0, seed=i, extra_body={"structured_outputs": {"regex": REGEX}})
            return out.choices[0].message.content

        texts = await asyncio.gather(*(one(i) for i in range(24)))
    assert all(re.fullmatch(REGEX, text) for text in texts), texts
