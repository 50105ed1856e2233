"""What the research agent refuses before any work starts: an image question when a role that must see
the image runs on a text-only engine, and a question or gold answers too long for the roles' contexts.
The agent raises ``QuestionRejected``; the server answers it with a 400.
"""

from __future__ import annotations

from ..engines.client import EngineClient
from ..config.agent import AgentRoles

CONTEXT_SHARE = 4
"""Question and gold answers may take at most 1/CONTEXT_SHARE of the smallest role context (they are
quoted in the prompts beside memories and observations)."""


class QuestionRejected(ValueError):
    """A research question the agent cannot take; the message says why in one sentence.

    ``field``: what is at fault (``question``, ``ground_truth`` or ``image``); ``code``: the OpenAI-style
    error code."""

    def __init__(self, message: str, *, field: str, code: str) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


def check_images(client: EngineClient, roles: AgentRoles) -> None:
    """The captioner and the Executor both see a question's image: their engines must take images."""
    seeing = dict.fromkeys((roles.captioner, roles.executor))
    blind = [role for role in seeing if not client.role(role).supports_images()]
    if blind:
        raise QuestionRejected(
            f"Image questions need roles that take images; in this configuration "
            f"{', '.join(f'`{r}`' for r in blind)} run on a text-only engine (see agent.roles.captioner and "
            "the engines' models).", field="image", code="images_not_supported")


async def check_fits(client: EngineClient, roles: AgentRoles, question: str, ground_truth: list[str] | None) -> None:
    """Question and gold answers must leave room in every role's context: at most a quarter of the
    smallest one, in the Planner's tokens, so an over-long question is refused up front, not after the
    research ran."""
    models = {roles.planner, roles.executor, roles.manager, roles.judge, roles.router}
    budget = min(client.role(m).max_model_len() for m in models) // CONTEXT_SHARE
    planner = client.role(roles.planner)
    for field, text in (("question", question), ("ground_truth", " ".join(ground_truth or []))):
        num_tokens = len(await planner.render_chat([{"role": "user", "content": text}]))
        if num_tokens > budget:
            raise QuestionRejected(f"The {field} takes {num_tokens} tokens; this server's models allow {budget}.",
                                   field=field, code="context_length_exceeded")
