"""The sampling fields of chat and text-completion requests as the engine takes them (``SamplingOptions``):
stop strings, logit bias, and the structured-output constraint."""

from __future__ import annotations

import re

import msgspec

from ..engines.client import SamplingOptions
from .errors import BadRequest
from .openai_bodies import MAX_INT, SamplingFields, StructuredOutputs


def sampling_options(request: SamplingFields, *, max_tokens: int | None,
                     logprobs: int | None, regex: str | None, json_schema: dict | None) -> SamplingOptions:
    """The sampling fields chat and completion requests share, as the engine takes them; the caller decides
    the budget, the log-probs (the two APIs spell them differently) and the constraint."""
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingOptions(
        n=request.n, temperature=request.temperature, top_p=request.top_p, max_tokens=max_tokens, stop=stop,
        seed=request.seed, logprobs=logprobs, presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty, top_k=request.top_k, min_p=request.min_p,
        repetition_penalty=request.repetition_penalty, logit_bias=logit_bias_ids(request.logit_bias),
        min_tokens=request.min_tokens, ignore_eos=request.ignore_eos, regex=regex, json_schema=json_schema,
    )


def logit_bias_ids(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as strings) as vLLM takes it: int keys, values clamped to
    [-100, 100]. An id outside the vocabulary is refused by the engine (also a 400)."""
    if not logit_bias:
        return None
    result = {}
    for key, bias in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise BadRequest(f"logit_bias key {key!r} is not a token id.", param="logit_bias") from None
        if not 0 <= token_id <= MAX_INT:
            raise BadRequest(f"logit_bias key {key!r} is not a token id.", param="logit_bias")
        result[token_id] = min(100.0, max(-100.0, bias))
    return result


def constraint(request: SamplingFields) -> tuple[str | None, dict | None]:
    """(regex, JSON schema) from ``structured_outputs`` or ``response_format``; an invalid regex or schema
    is refused by the engine when the request is added (also a 400)."""
    so, fmt = request.structured_outputs, request.response_format
    if so is not None and fmt is not None and fmt.type != "text":
        raise BadRequest("Give either structured_outputs or response_format, not both.", param="response_format")
    if so is not None:
        return _structured_outputs(so)
    if fmt is None or fmt.type == "text":
        return None, None
    if fmt.type == "json_object":
        return None, {"type": "object"}
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise BadRequest("response_format of type json_schema needs json_schema.schema.",
                         param="response_format.json_schema")
    return None, fmt.json_schema.schema


def _structured_outputs(so: StructuredOutputs) -> tuple[str | None, dict | None]:
    """(regex, JSON schema) of vLLM's ``structured_outputs``: exactly one of regex, json, choice."""
    given = [name for name in ("regex", "json", "choice") if getattr(so, name) is not None]
    if len(given) != 1:
        raise BadRequest("structured_outputs takes exactly one of regex, json, choice.",
                         param="structured_outputs")
    if so.choice is not None:
        return "|".join(re.escape(c) for c in so.choice), None
    if isinstance(so.json, str):
        try:
            schema = msgspec.json.decode(so.json)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
            raise BadRequest("structured_outputs.json is not valid JSON.", param="structured_outputs.json") from None
        if not isinstance(schema, dict):
            raise BadRequest("structured_outputs.json must be a JSON schema object.",
                             param="structured_outputs.json")
        return None, schema
    return so.regex, so.json
