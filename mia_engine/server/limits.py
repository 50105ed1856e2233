"""Size limits of a chat request, checked before any work starts; each refusal names its field."""

from __future__ import annotations

import msgspec

from ..config import LimitsConfig
from .errors import BadRequest
from .completion_bodies import CompletionRequest
from .grammar_cost import regex_cost, schema_cost, vocab_factor
from .openai_bodies import ChatCompletionRequest
from .template_kwargs import template_kwargs_of


def _over(param: str, what: str, limit: int) -> BadRequest:
    return BadRequest(f"{what} is more than this server allows ({limit}).", param=param, code="limit_exceeded")


def check_chat_limits(request: ChatCompletionRequest, limits: LimitsConfig, vocab_size: int = 0) -> None:
    """Every per-request cap of ``LimitsConfig`` that a chat body can break (``n`` is the caller's);
    ``vocab_size``: the requested model's vocabulary in tokens (0: unknown), which scales grammar costs."""
    for param in ("max_tokens", "max_completion_tokens"):
        check_max_tokens(param, getattr(request, param), limits)
    if request.rollouts is not None and request.rollouts > limits.max_rollouts:
        raise _over("rollouts", f"rollouts = {request.rollouts}", limits.max_rollouts)
    check_stop(request.stop, limits)
    check_structured(request, limits, vocab_size)
    template_kwargs_of(request)
    if request.tools:  # under tool_choice required, every tool's schema is compiled together into one grammar
        check_schema("tools", [tool.function.parameters for tool in request.tools], limits, vocab_size)
    _check_ground_truth(request.ground_truth, limits)


def check_max_tokens(param: str, value: int | None, limits: LimitsConfig) -> None:
    """A requested budget over ``limits.max_tokens``, where the operator set one (0: only the context
    bounds it, checked once the prompt is tokenised)."""
    if value is not None and limits.max_tokens and value > limits.max_tokens:
        raise _over(param, f"{param} = {value}", limits.max_tokens)


def check_stop(stop: str | list[str] | None, limits: LimitsConfig) -> None:
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > limits.max_stop_sequences:
        raise _over("stop", f"{len(stops)} stop sequences", limits.max_stop_sequences)
    if any(len(s) > limits.max_stop_chars for s in stops):
        raise _over("stop", "A stop sequence's length", limits.max_stop_chars)


def check_structured(request: ChatCompletionRequest | CompletionRequest, limits: LimitsConfig,
                     vocab_size: int = 0) -> None:
    """The size and estimated compile cost of a request's structured-output constraint."""
    so, fmt = request.structured_outputs, request.response_format
    if so is not None:
        if so.regex is not None and len(so.regex) > limits.max_regex_chars:
            raise _over("structured_outputs.regex", "The regex's length", limits.max_regex_chars)
        if so.regex is not None:
            _check_cost("structured_outputs.regex", "The regex", regex_cost(so.regex), limits, vocab_size)
        if so.choice is not None:
            if len(so.choice) > limits.max_choices:
                raise _over("structured_outputs.choice", f"{len(so.choice)} choices", limits.max_choices)
            if any(len(c) > limits.max_choice_chars for c in so.choice):
                raise _over("structured_outputs.choice", "A choice's length", limits.max_choice_chars)
        check_schema("structured_outputs.json", so.json, limits, vocab_size)
    if fmt is not None and fmt.json_schema is not None:
        check_schema("response_format.json_schema.schema", fmt.json_schema.schema, limits, vocab_size)


def check_schema(param: str, schema: dict | list | str | None, limits: LimitsConfig, vocab_size: int) -> None:
    """A JSON schema's byte cap and estimated compile cost on a ``vocab_size``-token vocabulary."""
    if schema is None:
        return
    size = len(schema.encode()) if isinstance(schema, str) else len(msgspec.json.encode(schema))
    if size > limits.max_json_schema_bytes:
        raise _over(param, f"The JSON schema ({size} bytes)", limits.max_json_schema_bytes)
    if isinstance(schema, str):
        try:
            schema = msgspec.json.decode(schema)
        except (msgspec.DecodeError, RecursionError):
            return  # refused as invalid JSON when the constraint is read
    _check_cost(param, "The JSON schema", schema_cost(schema), limits, vocab_size)


def _check_cost(param: str, what: str, cost: float, limits: LimitsConfig, vocab_size: int) -> None:
    """A constraint whose grammar would hold the engine's grammar compiler for long (``grammar_cost``)."""
    factor = vocab_factor(vocab_size)
    if cost * factor > limits.max_grammar_cost:
        on = f" on this model's {vocab_size}-token vocabulary" if factor > 1 else ""
        raise _over(param, f"{what}'s grammar (estimated compile cost {cost * factor:.0f}{on})",
                    limits.max_grammar_cost)


def _check_ground_truth(truth: str | list[str] | None, limits: LimitsConfig) -> None:
    answers = [truth] if isinstance(truth, str) else truth or []
    if sum(len(a) for a in answers) > limits.max_ground_truth_chars:
        raise _over("ground_truth", "The ground truth's length", limits.max_ground_truth_chars)


def check_question(question: str, param: str, limits: LimitsConfig) -> None:
    if len(question) > limits.max_question_chars:
        raise _over(param, f"The question's length ({len(question)} characters)", limits.max_question_chars)


def check_prompt_chars(num_chars: int, max_model_len: int, param: str, limits: LimitsConfig) -> None:
    """A prompt too long to fit the context whatever its tokens (``max_chars_per_token``), refused before
    it is tokenised."""
    limit = max_model_len * limits.max_chars_per_token
    if num_chars > limit:
        raise BadRequest(f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
                         f"{num_chars} characters (more than {limits.max_chars_per_token} a token).", param=param,
                         code="context_length_exceeded")
