"""What the streamed completions (chat, text, the research agent) share: server-sent events, and a
started generation's outputs as one stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..engines.client import CompletionDelta


async def chain(first: list[CompletionDelta], rest: AsyncIterator[list[CompletionDelta]]
                 ) -> AsyncIterator[list[CompletionDelta]]:
    if first:
        yield first
    async for deltas in rest:
        yield deltas


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
