"""The two decisions about plans: the Planner's reflection (replan or not: a yes or a no) and the
Router's pick among the G plans, each reply's parser next to its structured-output schema.

The parsers never raise: garbage gives a default (model output is untrusted text; see ``model_text``).
"""

from __future__ import annotations

import re
from typing import Any

from .model_text import as_int, first_json_object, strip_think

YES_NO_REGEX = "yes|no"
"""The reflection's whole output under structured outputs."""


def parse_yes_no(text: str) -> bool | None:
    """The reflection decision: True = replan; the first yes/no word counts; None when neither appears."""
    visible = strip_think(text if isinstance(text, str) else "").lower()
    match = re.search(r"\b(yes|no)\b", visible)
    return None if match is None else match.group(1) == "yes"


def is_exact_yes_no(text: str) -> bool:
    """The format reward's test: after the think block the answer is exactly "yes" or "no"."""
    return strip_think(text if isinstance(text, str) else "").lower() in ("yes", "no")


def parse_plan_choice(text: str, num_plans: int) -> int:
    """The Router's pick as a 0-based index; prompts number plans from 1; 0 when nothing valid is found."""
    if num_plans <= 1 or not isinstance(text, str):
        return 0
    visible = strip_think(text)
    value = first_json_object(visible)
    candidates: list[Any] = [value.get("plan"), value.get("choice")] if value else []
    candidates += re.findall(r"plan\s*#?\s*(\d+)", visible, flags=re.IGNORECASE)
    candidates += re.findall(r"\d+", visible)
    for candidate in candidates:
        number = as_int(candidate)
        if number is not None and 1 <= number <= num_plans:
            return number - 1
    return 0


def plan_choice_schema(num_plans: int) -> dict[str, Any]:
    """JSON schema of the Router's pick, plans numbered from 1."""
    return {
        "type": "object",
        "properties": {"plan": {"type": "integer", "enum": list(range(1, max(num_plans, 1) + 1))}},
        "required": ["plan"],
        "additionalProperties": False,
    }
