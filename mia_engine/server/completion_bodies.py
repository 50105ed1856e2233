"""OpenAI's legacy text-completions request and response bodies (``POST /v1/completions``), as vLLM serves them:
the prompt is a string, a list of strings, token ids, or a list of token-id lists."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from .openai_bodies import MAX_INT, SamplingFields, Usage


class CompletionRequest(SamplingFields):
    model: str
    prompt: str | Annotated[list[Any], Meta(min_length=1)]
    """A string, a list of strings, a list of token ids, or a list of token-id lists (checked in the handler:
    msgspec takes one list type per union)."""
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_INT)] | None = 16
    """Tokens to generate per completion (OpenAI's and vLLM's default, 16); ``null``: what the context leaves."""
    best_of: Annotated[int, Meta(ge=1, le=MAX_INT)] | None = None
    """Only 1 (or ``n``): the engine returns every sequence it samples."""
    echo: bool = False
    """Prepend the prompt's text to each completion."""
    suffix: str | None = None
    """Refused: no model here is trained to fill in the middle."""
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    """Log-probs of the sampled token and this many most likely ones, per generated token."""
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (e.g. BOS) to a text prompt (vLLM's default)."""


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None
    object: str = "text_completion"
