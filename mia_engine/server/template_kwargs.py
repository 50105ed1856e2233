"""A chat request's ``chat_template_kwargs`` (vLLM's extension): extra variables of the chat template, over
the role's own ``chat_template_kwargs`` (the request's win), e.g. ``{"enable_thinking": false}`` on Qwen3.

Bounded, since a template renders them into every prompt: a few names, each a plain identifier that is
none of the variables the template is rendered with already, each value a scalar (a short string, a number,
a boolean). Anything else is a 400 naming ``chat_template_kwargs`` before any work starts. vLLM's
top-level ``chat_template`` (a Jinja template sent with the request) is refused, as ``vllm serve`` refuses it
without ``--trust-request-chat-template``: a request-supplied template runs on the server's CPU.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import BadRequest
from .openai_bodies import ChatCompletionRequest

MAX_TEMPLATE_KWARGS = 16
"""Most variables one request may set."""
MAX_TEMPLATE_KWARG_CHARS = 1024
"""Longest string value."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
RESERVED_TEMPLATE_NAMES = frozenset({
    # What the server renders the template with (``RoleClient.render_chat``, transformers' apply_chat_template).
    "messages", "conversation", "conversations", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "chat_template", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
    # What transformers puts in every template's context: the tokenizer's special tokens and helpers.
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens", "raise_exception", "strftime_now",
})
"""Names a request may not set: the template's own variables and ``apply_chat_template``'s arguments."""


def template_kwargs_of(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The request's ``chat_template_kwargs``, checked (None: it sets none); ``chat_template`` is refused."""
    if request.chat_template is not None:
        raise BadRequest("A chat template sent with the request is not accepted (as vllm serve refuses one without "
                         "--trust-request-chat-template); the engine's template is used, with "
                         "`chat_template_kwargs` for its variables.", param="chat_template")
    kwargs = request.chat_template_kwargs
    if not kwargs:
        return None
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise _refused(f"{len(kwargs)} variables; at most {MAX_TEMPLATE_KWARGS} are accepted.")
    for name, value in kwargs.items():
        if not _NAME.fullmatch(name):
            raise _refused(f"{name[:80]!r} is not a variable name (letters, digits and _, at most 64).")
        if name in RESERVED_TEMPLATE_NAMES:
            raise _refused(f"`{name}` is a variable the server renders the template with; it cannot be set.")
        if isinstance(value, str) and len(value) > MAX_TEMPLATE_KWARG_CHARS:
            raise _refused(f"`{name}` is longer than {MAX_TEMPLATE_KWARG_CHARS} characters.")
    return dict(kwargs)


def _refused(why: str) -> BadRequest:
    return BadRequest(f"chat_template_kwargs: {why}", param="chat_template_kwargs")
