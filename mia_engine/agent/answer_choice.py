"""Which answer a rollout returns (``agent.answer_choice``): its own, as the paper does, or the better of
its own and a closed-book candidate, the Manager's model asked the question directly with no tools (the
eval's ``bare`` mode asks it the same way). A departure for small models (``small_model``): a 135M reader
that retrieval misled answers from an unrelated passage where the model alone knew the answer.

The choice is adaptive retrieval by the model's own confidence: trust the model's parametric answer when it
is confident, else the answer read off the retrieved evidence (Mallen et al., 2023, "When Not to Trust
Language Models", which retrieves only where the model is unlikely to know; FLARE, Jiang et al., 2023,
"Active Retrieval Augmented Generation", which retrieves when a generated token's probability falls below a
threshold; Self-RAG, Asai et al., 2024, which decides from the model's own reflection tokens). The
confidence is the closed-book answer's token log-probabilities as the engine sampled them (vLLM's), their
mean (the length-normalised sequence log-likelihood) or their minimum (FLARE's test), so it works for
any question in any script, with no rule about the question's or the answer's words:

    1. closed-book answer empty, or not asked     → own
    2. own answer empty                           → closed book
    3. confidence >= closed_book_min_logprob      → closed book
    4. otherwise                                  → own (the evidence answer)

The threshold is calibrated on a dev split (``bench/calibrate_choice.py``). The grounded judge
(``judge.py: GroundedJudge``) does not read this confidence: it checks the chosen answer against the
passages (``evidence_support.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

from . import prompts
from ..engines.client import EngineClient
from ..config.agent import AgentConfig
from .llm import Completion, complete_ids, sampling_options
from .model_text import strip_think
from .records import AnswerSource

Confidence = Literal["mean", "min"]


class AnswerChoice(NamedTuple):
    answer: str | None
    source: AnswerSource
    """``own``: the rollout's answer; ``closed_book``: the Manager's answer without tools."""


class ClosedBookAnswer(NamedTuple):
    """The Manager's answer without tools and the log-prob of each token it sampled (None: the engine gave
    none)."""

    text: str
    logprobs: Sequence[float] | None

    @classmethod
    def of(cls, completion: Completion) -> ClosedBookAnswer:
        """The answer after any thinking (the Manager runs with thinking off, as in the reference, so the
        log-probs are the answer's own tokens)."""
        return cls(strip_think(completion.after_thinking).strip(), completion.logprobs)

    def confidence(self, statistic: Confidence) -> float:
        """The mean or the minimum of the token log-probs (nats, <= 0); -inf without any."""
        if not self.logprobs:
            return float("-inf")
        return min(self.logprobs) if statistic == "min" else sum(self.logprobs) / len(self.logprobs)


class AnswerChooser(Protocol):
    is_closed_book: bool
    """The loop asks the closed-book candidate (one Manager call per question, beside the research)."""

    def choose(self, question: str, own: str | None, closed_book: ClosedBookAnswer | None,
               evidence: Sequence[str]) -> AnswerChoice:
        """The answer returned, given the rollout's, the closed-book one (None when not asked) and the
        texts of the rollout's successful searches."""
        ...


class OwnAnswer:
    """The rollout's own answer, always (``answer_choice = "own"``; paper, reference)."""

    is_closed_book = False

    def choose(self, question: str, own: str | None, closed_book: ClosedBookAnswer | None,
               evidence: Sequence[str]) -> AnswerChoice:
        return AnswerChoice(own, "own")


class ClosedBookChoice:
    """The module docstring's rule: the closed-book answer when the model is confident in it
    (``confidence`` of its log-probs >= ``min_logprob``), else the rollout's own."""

    is_closed_book = True

    def __init__(self, min_logprob: float, confidence: Confidence = "mean") -> None:
        self.min_logprob = min_logprob
        self.confidence = confidence

    def choose(self, question: str, own: str | None, closed_book: ClosedBookAnswer | None,
               evidence: Sequence[str]) -> AnswerChoice:
        if closed_book is None or not closed_book.text:
            return AnswerChoice(own, "own")
        if not (own or "").strip() or closed_book.confidence(self.confidence) >= self.min_logprob:
            return AnswerChoice(closed_book.text, "closed_book")
        return AnswerChoice(own, "own")


async def ask_closed_book(client: EngineClient, config: AgentConfig, question: str, *,
                          affinity_key: str | None = None) -> Completion | None:
    """The Manager's answer to the question alone, no tools, asked for a name or a number with the
    ``closed_book`` sampling and each sampled token's log-prob (the research loop's candidate and its
    confidence, and the eval's ``bare`` mode); None when the question does not fit the Manager's context."""
    manager = client.role(config.roles.manager)
    options = sampling_options(config.sampling.closed_book, affinity_key=affinity_key, logprobs=0)
    try:
        prompt = await manager.render_chat([{"role": "user", "content": prompts.CLOSED_BOOK.render(question=question)}])
        (completion,) = await complete_ids(manager, prompt, options)
    except ValueError:
        return None
    return completion
