"""Size limits of a request (chat, text completion, tokenize, embeddings), checked before any work starts:
before a prompt is tokenised, a text encoded or an engine request made; each refusal names its field."""

from __future__ import annotations

import msgspec

from ..config import LimitsConfig
from .errors import BadRequest
from .chat_messages import message_chars
from .completion_bodies import CompletionRequest
from .grammar_cost import regex_cost, schema_cost, vocab_factor
from .openai_bodies import ChatCompletionRequest
from .template_kwargs import template_kwargs_of


def _over(param: str, what: str, limit: int, setting: str = "") -> BadRequest:
    """``setting``: the ``server.limits`` field an operator raises to accept it, named in the message."""
    where = f", server.limits.{setting}" if setting else ""
    return BadRequest(f"{what} is more than this server allows ({limit}{where}).", param=param,
                      code="limit_exceeded")


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
    if request.logprobs:  # without max_tokens, checked again once the context left is known (ChatService)
        requested = request.max_completion_tokens or request.max_tokens or limits.max_tokens
        check_logprob_entries(chat_logprobs_param(request), request.n * requested if requested else None,
                              request.top_logprobs or 0, limits)


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


def chat_prompt_chars(request: ChatCompletionRequest) -> int:
    """Characters of everything a chat request puts into its prompt: every message's text, name and tool
    calls (``message_chars``), the tool definitions (as JSON) and the template variables."""
    num_chars = sum(message_chars(m) for m in request.messages)
    if request.tools:
        num_chars += len(msgspec.json.encode(request.tools))
    for name, value in (request.chat_template_kwargs or {}).items():
        num_chars += len(name) + len(str(value))
    return num_chars


def check_token_ids(num_ids: int, max_model_len: int, param: str) -> None:
    """Token ids to turn into text (``/detokenize``): at most what the model's context holds, a prompt and its
    completion together."""
    if num_ids > max_model_len:
        raise BadRequest(f"{num_ids} token ids is more than this model's context holds ({max_model_len}).",
                         param=param, code="limit_exceeded")


def chat_logprobs_param(request: ChatCompletionRequest) -> str:
    return "top_logprobs" if request.top_logprobs else "logprobs"


def check_logprob_entries(param: str, num_tokens: int | None, num_top: int | None, limits: LimitsConfig) -> None:
    """Log-probs of up to ``num_tokens`` sampled tokens (n x prompts x max_tokens), ``num_top`` candidates each
    besides the sampled one, over ``limits.max_logprob_entries``; None: no log-probs asked for, or a budget
    not known yet."""
    if num_top is None or num_tokens is None:
        return
    entries = num_tokens * (num_top + 1)
    if entries > limits.max_logprob_entries:
        raise _over(param, f"Log-probs of {num_tokens} tokens (n x prompts x max_tokens) with {num_top + 1} entries "
                    f"each ({entries})", limits.max_logprob_entries, "max_logprob_entries")


def check_embedding_inputs(texts: list[str], limits: LimitsConfig) -> None:
    """The texts of one embeddings request: how many, and their characters together."""
    if len(texts) > limits.max_embedding_inputs:
        raise _over("input", f"{len(texts)} texts", limits.max_embedding_inputs, "max_embedding_inputs")
    num_chars = sum(len(text) for text in texts)
    if num_chars > limits.max_embedding_chars:
        raise _over("input", f"{num_chars} characters over all texts", limits.max_embedding_chars,
                    "max_embedding_chars")
