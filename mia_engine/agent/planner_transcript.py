"""The Planner's conversation of one rollout in token space (plan, reflection, replan), with which
tokens the Planner sampled: what the learner trains on (MIA Eq. 3: the Planner's own tokens only)."""

from __future__ import annotations

from .records import PlannerTokens


class PlannerTranscript:
    """The Planner's conversation of one rollout, in token space, with which tokens it sampled."""

    def __init__(self, prompt_ids: list[int], plan_ids: list[int], *, is_sampled: bool = True) -> None:
        """``is_sampled``: the plan's tokens are the policy's own samples (else they are context only)."""
        self.prompt_ids = list(prompt_ids)
        self.completion_ids = list(plan_ids)
        self.mask = [int(is_sampled)] * len(plan_ids)

    def ids(self) -> list[int]:
        return [*self.prompt_ids, *self.completion_ids]

    def append(self, prompt: list[int], generated: list[int], *, is_sampled: bool = True) -> None:
        """A turn: ``prompt`` extends ``ids()`` by the template's tokens (not the Planner's), then
        ``generated`` (the policy's own samples when ``is_sampled``)."""
        glue = prompt[len(self.prompt_ids) + len(self.completion_ids):]
        self.completion_ids += [*glue, *generated]
        self.mask += [0] * len(glue) + [int(is_sampled)] * len(generated)

    def tokens(self) -> PlannerTokens | None:
        if not any(self.mask) or not self.prompt_ids:
            return None  # a client without token ids (nothing to learn from)
        return PlannerTokens(self.prompt_ids, self.completion_ids, self.mask)
