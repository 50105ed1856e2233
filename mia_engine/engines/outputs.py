"""vLLM's side of a generation in our terms and back: ``SamplingParams`` from a request's
``SamplingOptions`` over its role's defaults, and each ``RequestOutput`` as ``CompletionDelta``s with
their log-probs (converted in slices where there are many, so the event loop keeps turning)."""

from __future__ import annotations

import asyncio

from vllm import SamplingParams
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from ..config import SamplingDefaults
from .client import CompletionDelta, SamplingOptions, TokenLogprob, TopLogprob


def sampling_params(options: SamplingOptions, defaults: SamplingDefaults, stream: bool) -> SamplingParams:
    """vLLM sampling parameters: the request's values over the role's defaults."""
    structured = None
    if options.regex is not None or options.json_schema is not None:
        structured = StructuredOutputsParams(regex=options.regex, json=options.json_schema)
    return SamplingParams(
        n=options.n,
        temperature=defaults.temperature if options.temperature is None else options.temperature,
        top_p=defaults.top_p if options.top_p is None else options.top_p,
        top_k=defaults.top_k if options.top_k is None else options.top_k,
        min_p=options.min_p or 0.0,
        repetition_penalty=1.0 if options.repetition_penalty is None else options.repetition_penalty,
        presence_penalty=defaults.presence_penalty if options.presence_penalty is None else options.presence_penalty,
        frequency_penalty=options.frequency_penalty or 0.0,
        logit_bias=options.logit_bias or None,
        min_tokens=options.min_tokens,
        ignore_eos=options.ignore_eos,
        max_tokens=options.max_tokens,
        stop=options.stop or None,
        seed=options.seed,
        logprobs=options.logprobs,
        flat_logprobs=True,  # vLLM keeps them as a few flat lists, not a dict and Logprob objects per token
        structured_outputs=structured,
        skip_special_tokens=options.skip_special_tokens,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
    )


MAX_LOGPROBS_ON_LOOP = 4096
"""Log-prob objects converted between two turns of the event loop (an output with more is converted in
slices of about this many: a few milliseconds each)."""


def has_many_logprobs(output: RequestOutput, num_logprobs: int | None) -> bool:
    """Whether converting ``output`` builds more than ``MAX_LOGPROBS_ON_LOOP`` log-prob objects (a whole
    completion with n = 16, 20 top candidates and 4096 tokens builds over a million)."""
    if num_logprobs is None:
        return False
    return sum(len(c.token_ids) for c in output.outputs) * (num_logprobs + 1) > MAX_LOGPROBS_ON_LOOP


def to_deltas(output: RequestOutput, num_logprobs: int | None) -> list[CompletionDelta]:
    return [
        CompletionDelta(c.index, c.text, len(c.token_ids),
                        _logprobs(c, num_logprobs) if num_logprobs is not None else None,
                        c.finish_reason, list(c.token_ids))
        for c in output.outputs
    ]


async def to_deltas_in_slices(output: RequestOutput, num_logprobs: int) -> list[CompletionDelta]:
    """``to_deltas`` with the log-probs converted slice by slice, giving the event loop a turn between slices
    (in a thread they would still hold the GIL; a whole completion can carry over a million of them)."""
    num_tokens = max(1, MAX_LOGPROBS_ON_LOOP // (num_logprobs + 1))
    deltas = []
    for c in output.outputs:
        logprobs: list[TokenLogprob] = []
        for start in range(0, len(c.token_ids), num_tokens):
            logprobs += _logprobs(c, num_logprobs, start, start + num_tokens)
            await asyncio.sleep(0)
        deltas.append(CompletionDelta(c.index, c.text, len(c.token_ids), logprobs, c.finish_reason,
                                      list(c.token_ids)))
    return deltas


def _logprobs(completion: CompletionOutput, num_top: int, start: int = 0, stop: int | None = None
              ) -> list[TokenLogprob]:
    """Positions ``start:stop`` of the completion's log-probs, read straight from vLLM's ``FlatLogprobs``
    (``flat_logprobs``): at each position the sampled token comes first, then the top candidates by rank."""
    flat = completion.logprobs
    if not flat:
        return []
    starts, ends, tokens, values = flat.start_indices, flat.end_indices, flat.decoded_tokens, flat.logprobs
    result = []
    for position in range(start, len(starts) if stop is None else min(stop, len(starts))):
        first, end = starts[position], ends[position]
        top = [TopLogprob(tokens[i] or "", values[i]) for i in range(first + 1, min(end, first + 1 + num_top))]
        result.append(TokenLogprob(tokens[first] or "", values[first], top))
    return result
