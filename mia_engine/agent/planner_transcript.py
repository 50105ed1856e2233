"""The Planner's conversation of one rollout in token space (plan, reflection, replan), with which
tokens the Planner sampled, under which regex, and the sampler's log-prob of each: what the learner
trains on (MIA Eq. 3: the Planner's own tokens only), and the raw texts the format reward reads.

Every token the Planner generated is its policy's sample, a regex-constrained one included: the engine
drew it from the policy's distribution restricted to what the grammar allowed, and the learner scores it
under the same restriction (``learner.grammar_mask``)."""

from __future__ import annotations

import math

from .llm import Completion
from .records import PlannerSegment, PlannerTexts, PlannerTokens


class PlannerTranscript:
    """The Planner's conversation of one rollout, in token space, with its sampled segments."""

    def __init__(self, prompt_ids: list[int], plan: Completion | None, *, regex: str | None = None,
                 policy_version: int | None = None) -> None:
        """``plan``: the plan's completion (None: no plan, plain ReAct), sampled under ``regex`` (None = free)
        by adapter version ``policy_version``."""
        self.prompt_ids = list(prompt_ids)
        self.completion_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.segments: list[PlannerSegment] = []
        self.policy_version = policy_version
        self._has_logprobs = False
        self.texts = PlannerTexts(plan.text if plan is not None else "")
        if plan is not None:
            self._add(plan, regex)

    def ids(self) -> list[int]:
        return [*self.prompt_ids, *self.completion_ids]

    def append(self, prompt: list[int], generated: Completion, *, regex: str | None = None) -> None:
        """A turn: ``prompt`` extends ``ids()`` by the template's tokens (not the Planner's), then the
        Planner's ``generated`` completion, sampled under ``regex`` (None = free)."""
        glue = prompt[len(self.prompt_ids) + len(self.completion_ids):]
        self.completion_ids += glue
        self.mask += [0] * len(glue)
        self.logprobs += [math.nan] * len(glue)
        self._add(generated, regex)

    def record_reflection(self, text: str) -> None:
        """The reflection's raw text (thinking included)."""
        self.texts = PlannerTexts(self.texts.plan, text, self.texts.replan)

    def record_replan(self, text: str) -> None:
        """The replan's raw text (thinking included)."""
        self.texts = PlannerTexts(self.texts.plan, self.texts.reflection, text)

    def tokens(self) -> PlannerTokens | None:
        if not any(self.mask) or not self.prompt_ids:
            return None  # a client without token ids (nothing to learn from)
        return PlannerTokens(self.prompt_ids, self.completion_ids, self.mask, self.segments,
                             self.logprobs if self._has_logprobs else None, self.policy_version)

    def _add(self, completion: Completion, regex: str | None) -> None:
        start = len(self.completion_ids)
        self.completion_ids += completion.token_ids
        self.mask += [1] * len(completion.token_ids)
        given = completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids)
        self._has_logprobs |= given and bool(completion.token_ids)
        self.logprobs += list(completion.logprobs) if given else [math.nan] * len(completion.token_ids)
        if completion.token_ids:
            self.segments.append(PlannerSegment(start, len(self.completion_ids), regex))
