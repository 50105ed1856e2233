"""One chat completion through the engine interface, as every role of the loop calls it.

The loop builds ``messages`` and ``SamplingOptions`` with pure functions, then awaits ``complete``;
nothing here knows about vLLM, so logic around it is tested with a fake client.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import msgspec

from ..config.agent import RoleSampling
from ..engines.client import RoleClient, SamplingOptions


class Completion(msgspec.Struct, frozen=True):
    """One generated completion: its text and the token ids the engine sampled."""

    text: str
    token_ids: list[int]
    content: str | None = None
    """The text after its thinking, as the engine's reasoning parser reads it (``engines.<name>.reasoning_parser``,
    the chat API's ``message.content``); None on an engine without one, or for a constrained call."""
    logprobs: list[float] | None = None
    """Each sampled token's log-prob as the engine's sampler computed it (after any structured-output mask,
    before temperature: vLLM's ``raw_logprobs``), one per ``token_ids`` entry; None unless the options asked
    for ``logprobs``."""

    @property
    def after_thinking(self) -> str:
        """What the loop reads of it: the reasoning parser's content where the engine has one, else the whole
        text (whose ``<think>`` blocks ``model_text.strip_think`` takes off where it is read)."""
        return self.text if self.content is None else self.content


def sampling_options(sampling: RoleSampling, *, n: int = 1, stop: list[str] | None = None,
                     regex: str | None = None, json_schema: dict | None = None,
                     temperature: float | None = None, affinity_key: str | None = None,
                     logprobs: int | None = None) -> SamplingOptions:
    """A role's configured sampling as per-request options (``temperature`` overrides the config;
    ``affinity_key`` sends every call with the same key to the same data-parallel replica). On an engine with
    a reasoning parser, a constraint applies from the first token (the loop's regexes spell out any think
    block they allow, as on an engine without one), and free text comes with its thinking split off
    (``Completion.content``). ``logprobs``: 0 asks for each sampled token's log-prob (``Completion.logprobs``)."""
    return SamplingOptions(
        n=n,
        temperature=sampling.temperature if temperature is None else temperature,
        max_tokens=sampling.max_tokens,
        presence_penalty=sampling.presence_penalty or None,
        stop=list(stop or []),
        regex=regex,
        json_schema=json_schema,
        affinity_key=affinity_key,
        logprobs=logprobs,
        reasoning_ended=True,
        split_thinking=regex is None and json_schema is None,
    )


def with_policy_logprobs(options: SamplingOptions) -> SamplingOptions:
    """``options`` asking for each sampled token's log-prob where the engine's are the sampling policy's:
    vLLM returns them after the structured-output mask but before temperature and penalties
    (``raw_logprobs``), so only at temperature 1 without penalties or truncation. Otherwise unchanged: the
    learner then takes its own log-probs as the old policy (``GRPOSample.old_logprobs``)."""
    is_policy = (options.temperature == 1.0 and not options.presence_penalty and not options.frequency_penalty
                 and options.repetition_penalty in (None, 1.0) and options.top_p in (None, 1.0)
                 and options.top_k in (None, 0, -1) and not options.min_p and not options.logit_bias)
    return msgspec.structs.replace(options, logprobs=0) if is_policy else options


def with_room_for(options: SamplingOptions, num_chars: int) -> SamplingOptions:
    """``options`` whose token budget never cuts what its regex allows (``num_chars``: the longest such
    text; a token is at least one character): a cut tool call or plan would parse as garbage.
    Unchanged without a regex."""
    if options.regex is None:
        return options
    return msgspec.structs.replace(options, max_tokens=max(options.max_tokens or 0, num_chars))


async def complete(
    role: RoleClient, messages: list[dict[str, Any]], options: SamplingOptions,
    request_id: str | None = None, images: Sequence[Any] = (), *, keep_thinking: bool = True,
) -> list[str]:
    """Render the chat, fit ``max_tokens`` to the context left, generate, and return the n texts.
    ``images``: the decoded images whose ``{"type": "image"}`` parts the messages hold, in order.
    ``keep_thinking=False``: each text after its thinking where the engine's reasoning parser split it off
    (``Completion.after_thinking``)."""
    prompt_ids = await role.render_chat(messages)
    completions = await complete_ids(role, prompt_ids, options, request_id, images)
    return [c.text if keep_thinking else c.after_thinking for c in completions]


async def complete_ids(
    role: RoleClient, prompt_ids: list[int], options: SamplingOptions,
    request_id: str | None = None, images: Sequence[Any] = (),
) -> list[Completion]:
    """Generate from a prompt already in token space; the n completions with their token ids."""
    # What is left of the context (raises once the prompt fills it), capped by the role's budget: a
    # long trajectory near the end of the context still gets its last, shorter turn.
    room = role.max_tokens_for(len(prompt_ids), None)
    options = msgspec.structs.replace(options, max_tokens=min(options.max_tokens, room) if options.max_tokens else room)
    completions = [Completion("", [])] * options.n
    request_id = request_id or f"agent-{uuid.uuid4().hex}"
    extra = {"images": list(images)} if images else {}  # text-only calls keep the plain signature
    async with aclosing(role.generate(prompt_ids, options, request_id, stream=False, **extra)) as outputs:
        async for deltas in outputs:
            for delta in deltas:
                if 0 <= delta.index < len(completions):  # non-streaming: each delta is a whole completion
                    logprobs = [t.logprob for t in delta.logprobs] if delta.logprobs is not None else None
                    completions[delta.index] = Completion(delta.text, list(delta.token_ids), delta.content, logprobs)
    return completions
