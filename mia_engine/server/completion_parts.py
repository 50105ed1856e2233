"""Completions encoded in parts (a ``JSONPartsResponse``'s body): choices one by one, log-probs slice by
slice, so that no single encoder call or copy holds the event loop for long."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from ..engines.client import TokenLogprob
from .openai_bodies import ChatCompletion, ChoiceLogprobs, TokenLogprobOut, TopLogprobOut

LOGPROB_TOKENS_PER_SLICE = 128
"""Tokens whose log-probs are built and encoded between two turns of the event loop (a few milliseconds
with 20 top candidates each)."""


async def encode_with_logprobs(completion: ChatCompletion, logprobs: list[list[TokenLogprob]]) -> list[bytes]:
    """``completion`` encoded in parts with each choice's log-probs (``logprobs[i]`` for ``choices[i]``), slice
    by slice, giving the event loop a turn between slices: n = 16 choices of 4096 tokens with 20 top
    candidates are over a million objects (in a thread they would still hold the GIL), and tens of
    megabytes, which stay in their slices (joined, the copy would hold the loop)."""
    encoded = []
    for choice, choice_logprobs in zip(completion.choices, logprobs):
        head = msgspec.json.encode(msgspec.structs.replace(choice, logprobs=ChoiceLogprobs([])))
        before, found, after = head.partition(b'"logprobs":{"content":[]}')  # strings escape quotes: found once
        assert found, "a choice encodes its log-probs field"
        parts = [before + b'"logprobs":{"content":[']
        for start in range(0, len(choice_logprobs), LOGPROB_TOKENS_PER_SLICE):
            content = choice_logprobs_out(choice_logprobs[start:start + LOGPROB_TOKENS_PER_SLICE]).content
            parts.append((b"," if start else b"") + msgspec.json.encode(content)[1:-1])
            await asyncio.sleep(0)
        parts.append(b"]}" + after)
        encoded.append(parts)
    return splice_choices(completion, encoded)


def encode_choices_apart(completion: Any, choices: list[Any]) -> list[bytes]:
    """``completion`` (a struct with a ``choices`` field) encoded in parts with ``choices``, each encoded on
    its own: no single encoder call, and no copy into one buffer, holds the interpreter (and so the event
    loop) for long."""
    return splice_choices(completion, [[msgspec.json.encode(c)] for c in choices])


def splice_choices(completion: Any, encoded: list[list[bytes]]) -> list[bytes]:
    """``completion`` (a struct with a ``choices`` field) encoded in parts, with its choices given already
    encoded, each in parts."""
    head = msgspec.json.encode(msgspec.structs.replace(completion, choices=[]))
    before, found, after = head.partition(b'"choices":[]')  # quotes inside strings are escaped: found once
    assert found, "the completion encodes its choices field"
    parts = [before + b'"choices":[']
    for index, choice in enumerate(encoded):
        if index:
            parts.append(b",")
        parts += choice
    parts.append(b"]" + after)
    return parts


def choice_logprobs_out(logprobs: list[TokenLogprob] | None) -> ChoiceLogprobs:
    """The engine's log-probs of a choice as the chat API answers them (each token with its UTF-8 bytes)."""
    content = [
        TokenLogprobOut(lp.token, lp.logprob, tuple(lp.token.encode()),
                        [TopLogprobOut(t.token, t.logprob, tuple(t.token.encode())) for t in lp.top])
        for lp in logprobs or []
    ]
    return ChoiceLogprobs(content)
