"""Which answer a rollout returns (``agent.answer_choice``): its own, as the paper does, or the better of
its own and a closed-book candidate, the Manager's model asked the question directly with no tools (the
eval's ``bare`` mode asks it the same way). A departure for small models (``small_model``): a 135M
reader that retrieval misled answers from an unrelated passage, the title of one, or "not specified",
where the model alone knew the answer (Mallen et al., 2023, "When Not to Trust Language Models").

The closed-book rule, in order (support, claims, salvage and degenerate answers: ``evidence_support.py``),
after each hedged answer is salvaged ("Victor Hugo ... is not mentioned in the passage" → "Victor Hugo"
when a passage about the question supports it):

    1. own answer degenerate              → closed book (unless it is degenerate too)
    2. closed-book answer degenerate      → own
    3. neither supported                  → closed book   (the searches missed: trust the model)
    4. otherwise the better supported     → own on a tie  (the passages decide between the two)

"Supported" is ``support >= min_support``: a passage holds a claim of the answer and enough of the
question's key terms to be about its subject.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from . import prompts
from ..engines.client import EngineClient
from ..config.agent import AgentConfig
from .llm import Completion, complete_ids, sampling_options
from .evidence_support import QuestionTerms, is_degenerate, passages_of, salvage, support
from .records import AnswerSource


class AnswerChoice(NamedTuple):
    answer: str | None
    source: AnswerSource
    """``own``: the rollout's answer; ``closed_book``: the Manager's answer without tools."""


class AnswerChooser(Protocol):
    is_closed_book: bool
    """The loop asks the closed-book candidate (one Manager call per question, beside the research)."""

    def choose(self, question: str, own: str | None, closed_book: str | None,
               evidence: Sequence[str]) -> AnswerChoice:
        """The answer returned, given the rollout's, the closed-book one (None when not asked) and the
        texts of the rollout's successful searches."""
        ...


class OwnAnswer:
    """The rollout's own answer, always (``answer_choice = "own"``; paper, reference)."""

    is_closed_book = False

    def choose(self, question: str, own: str | None, closed_book: str | None,
               evidence: Sequence[str]) -> AnswerChoice:
        return AnswerChoice(own, "own")


class ClosedBookChoice:
    """The module docstring's rule between the rollout's answer and the closed-book candidate."""

    is_closed_book = True

    def __init__(self, min_support: float) -> None:
        self.min_support = min_support

    def choose(self, question: str, own: str | None, closed_book: str | None,
               evidence: Sequence[str]) -> AnswerChoice:
        terms = QuestionTerms.of(question)
        passages = passages_of(evidence)
        own = salvage(own, passages, terms, self.min_support)
        if closed_book is None:
            return AnswerChoice(own, "own")
        closed_book = salvage(closed_book, passages, terms, self.min_support)
        if is_degenerate(closed_book, terms):
            return AnswerChoice(own, "own")
        if is_degenerate(own, terms):
            return AnswerChoice(closed_book, "closed_book")
        own_support, closed_support = support(own, passages, terms), support(closed_book, passages, terms)
        if max(own_support, closed_support) < self.min_support or closed_support > own_support:
            return AnswerChoice(closed_book, "closed_book")
        return AnswerChoice(own, "own")


async def ask_closed_book(client: EngineClient, config: AgentConfig, question: str, *,
                          affinity_key: str | None = None) -> Completion | None:
    """The Manager's answer to the question alone, no tools, asked for a name or a number with the
    ``closed_book`` sampling (the research loop's candidate and the eval's ``bare`` mode); None when the
    question does not fit the Manager's context."""
    manager = client.role(config.roles.manager)
    options = sampling_options(config.sampling.closed_book, affinity_key=affinity_key)
    try:
        prompt = await manager.render_chat([{"role": "user", "content": prompts.CLOSED_BOOK.render(question=question)}])
        (completion,) = await complete_ids(manager, prompt, options)
    except ValueError:
        return None
    return completion
