"""Chat messages as a chat template takes them: text only for a text model, text and image parts for a
vision-language one, with their tool calls; and a message's text for the research agent."""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import BadRequest
from .openai_bodies import ChatMessage, TextPart


def template_message(message: ChatMessage) -> dict[str, Any]:
    """A message for a vision-language chat template: text and ``{"type": "image"}`` parts, in order."""
    content = message.content
    if not isinstance(content, list):
        return {"role": message.role, "content": content or ""}
    parts = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"} for p in content]
    return {"role": message.role, "content": parts}


def message_text(message: ChatMessage) -> str:
    """The text of a message, its image parts left out (the research agent takes the image separately)."""
    content = message.content
    if not isinstance(content, list):
        return content or ""
    return "\n".join(p.text for p in content if isinstance(p, TextPart))


def message_chars(message: ChatMessage) -> int:
    """Characters of everything of a message a chat template may render: its text parts, its name, its tool
    calls (ids, function names, arguments) and the call it answers (images are bounded apart, ``images.py``)."""
    num_chars = len(message.name or "") + len(message.tool_call_id or "")
    if isinstance(message.content, list):
        num_chars += sum(len(p.text) for p in message.content if isinstance(p, TextPart))
    else:
        num_chars += len(message.content or "")
    for call in message.tool_calls or ():
        num_chars += len(call.id) + len(call.type) + len(call.function.name) + len(call.function.arguments)
    return num_chars


def with_tool_fields(message: ChatMessage, rendered: dict[str, Any]) -> dict[str, Any]:
    """``rendered`` with the message's tool calls (arguments as JSON text) and the call it answers."""
    if message.tool_calls:
        rendered["tool_calls"] = [msgspec.to_builtins(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def flatten_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """Text content only, for a text model (an image part is refused)."""
    content = message.content
    if content is None:
        return {"role": message.role, "content": ""}
    if isinstance(content, str):
        return {"role": message.role, "content": content}
    texts = []
    for part in content:
        if not isinstance(part, TextPart):
            raise BadRequest("This model does not take images.", param=f"messages[{index}].content")
        texts.append(part.text)
    return {"role": message.role, "content": "\n".join(texts)}
