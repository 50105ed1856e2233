"""An engine's start-up warm-up: rounds of synthetic requests of every batch size up to a bound.

On vLLM's CPU platform the engine's worker takes its step buffers (activations, logits, the sampler's
sorts and penalties) from the allocator at the size of each step, so its heap grows to what the largest
and most varied steps need only as traffic happens to send them. The warm-up sends them before the
server reports ready: round ``b`` runs ``b`` requests at once, for ``b`` = 1, 2, 4, ... up to
``EngineConfig.warmup_max_seqs``, after one prompt of a whole step's token budget, every
adapter of the engine's roles and the base model mixed in one batch, greedy and sampled, with and without
a presence penalty. Random token ids, ``ignore_eos``: every request decodes its full length, so each
round decodes at its batch size. It costs start-up time on every start, more the higher the bound.
The requests go to the engine directly, past the server's per-role
metrics; vLLM's own ``vllm:*`` counters include them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from contextlib import aclosing

import msgspec
from vllm import SamplingParams
from vllm.lora.request import LoRARequest

from .vllm_engine import VLLMEngine

log = logging.getLogger(__name__)

DECODE_TOKENS = 8
"""Tokens each warm-up request generates: decode steps at the round's batch size, for the sampler and the
LoRA kernels to run at that size."""
MIN_PROMPT_TOKENS = 8
"""Shortest warm-up prompt."""
FIRST_TOKEN_ID = 100
"""Prompts draw token ids from here to the end of the vocabulary, past the special tokens at its start."""


class WarmupRound(msgspec.Struct, frozen=True):
    """One round: its requests' prompt lengths in tokens (as many as the round's batch size)."""

    prompt_lens: list[int]


def batch_sizes(max_seqs: int) -> list[int]:
    """1, 2, 4, ... doubling below ``max_seqs``, then ``max_seqs`` itself; empty for 0."""
    sizes, size = [], 1
    while size < max_seqs:
        sizes.append(size)
        size *= 2
    return [*sizes, max_seqs] if max_seqs > 0 else []


def plan(max_seqs: int, step_tokens: int, max_model_len: int, seed: int = 0) -> list[WarmupRound]:
    """The rounds for ``max_seqs``. The first is one prompt of a whole step's ``step_tokens`` (the largest
    step the engine runs); in round ``b`` > 1 the prompt lengths are drawn uniformly (seeded) from
    ``MIN_PROMPT_TOKENS`` to a ``b``-th of a step, so it prefills about half a step in steps of varied
    sizes. No prompt leaves less than ``DECODE_TOKENS`` of the context."""
    rng = random.Random(seed)
    longest = max(MIN_PROMPT_TOKENS, max_model_len - DECODE_TOKENS)
    rounds = []
    for size in batch_sizes(max_seqs):
        if size == 1:
            rounds.append(WarmupRound([min(longest, step_tokens)]))
            continue
        high = max(MIN_PROMPT_TOKENS, min(longest, step_tokens // size))
        rounds.append(WarmupRound([rng.randint(MIN_PROMPT_TOKENS, high) for _ in range(size)]))
    return rounds


def sampling(index: int) -> SamplingParams:
    """Request ``index``'s sampling: greedy or sampled (top-p, top-k) in turn, every third with a presence
    penalty, as the roles send."""
    sampled = index % 2 == 1
    return SamplingParams(
        temperature=1.0 if sampled else 0.0, top_p=0.9 if sampled else 1.0, top_k=50 if sampled else 0,
        presence_penalty=1.1 if index % 3 == 0 else 0.0, max_tokens=DECODE_TOKENS, ignore_eos=True, seed=index)


async def warm_up(engine: VLLMEngine, loras: Sequence[LoRARequest | None], max_seqs: int) -> int:
    """Run ``plan``'s rounds on ``engine``, one after the other, request ``i`` of a round on
    ``loras[i % len(loras)]`` (``None``: the base model); returns the number of requests served."""
    rounds = plan(max_seqs, engine.max_num_batched_tokens, engine.config.max_model_len, engine.config.seed)
    if not rounds:
        return 0
    rng = random.Random(engine.config.seed)
    vocab = len(engine.tokenizer)  # the ids it can detokenize: a config's vocab_size may pad past them
    began, served = time.monotonic(), 0
    log.info("engine %s: warming up with rounds of %s requests at once", engine.name,
             ", ".join(str(len(r.prompt_lens)) for r in rounds))
    for number, round_ in enumerate(rounds):
        prompts = [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(length)] for length in round_.prompt_lens]
        await asyncio.gather(*(
            _one(engine, prompt, sampling(i), f"warmup-{number}-{i}", loras[i % len(loras)])
            for i, prompt in enumerate(prompts)))
        served += len(prompts)
    log.info("engine %s: warmed up: %d requests, %d prompt tokens, in %.1f s", engine.name, served,
             sum(sum(r.prompt_lens) for r in rounds), time.monotonic() - began)
    return served


async def _one(engine: VLLMEngine, prompt: list[int], params: SamplingParams, request_id: str,
               lora: LoRARequest | None) -> None:
    async with aclosing(engine.generate(prompt, params, request_id, lora)) as outputs:
        async for _ in outputs:
            pass
