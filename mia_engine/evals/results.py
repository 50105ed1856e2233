"""What one ``eval`` pass produces: each question's prediction and the pass's averages, and the names
of the modes (``evaluate.py`` runs the passes, ``report.py`` prints and plots them)."""

from __future__ import annotations

from typing import Any

import msgspec

BASELINES = ("bare", "react", "mia_g1", "mia_g4")
TTL_MODES = ("ttl_supervised", "ttl_unsupervised")
MODES = (*BASELINES, *TTL_MODES)
METRICS = ("match", "exact", "judge")
"""How an answer counts as right: normalised exact-or-contains match (the default), exact match alone,
or the paper's LLM judge (``--metric judge``, ``judge.py``)."""


class Prediction(msgspec.Struct, frozen=True):
    """One question's outcome in one pass."""

    id: str
    prediction: str
    is_match: bool
    is_found: bool
    num_tool_calls: int
    num_tokens: int
    """Generated tokens: the bare answer; or, over all rollouts, the Planner's plan, reflection and
    replan and the Executor's generated turns and evidence answer (re-tokenized from their texts, the
    same count whether or not a rollout learned). Judge, Router and Manager summaries are not counted."""
    seconds: float
    """This question's latency (with ``concurrency`` questions in flight)."""
    judge: str | None = None
    """Who judged the returned answer in a learning pass: ``supervised`` / ``unsupervised`` (None: no judge)."""
    is_exact: bool = False
    """The normalised answer equals a gold answer (``is_match`` also takes a gold answer it contains)."""
    grade: str | None = None
    """``eval --metric judge``: the paper's judge's letter, A correct / B incorrect / C not attempted (None:
    not judged)."""

    def is_correct(self, metric: str) -> bool:
        """Right by ``metric``: ``judge`` = graded A, ``exact``, or ``match`` (exact or contains)."""
        return {"judge": self.grade == "A", "exact": self.is_exact}.get(metric, self.is_match)


class PassResult(msgspec.Struct, frozen=True):
    """One pass over the questions."""

    mode: str
    epoch: int | None
    """TTL: the epoch after which this was measured (1..E); None for a baseline."""
    is_learning: bool
    """A TTL pass that learned (G rollouts, judge, memory, GRPO) rather than a G = 1 measurement."""
    accuracy: float
    answers_found: float
    tool_calls_per_question: float
    tokens_per_question: float
    seconds_per_question: float
    """The pass's wall time / its questions (throughput at the given concurrency)."""
    wall_seconds: float
    predictions: list[Prediction]
    num_updates: int = 0
    """GRPO updates of the Planner published during this pass (learning passes)."""
    split: str = ""
    """The questions' split (``--split``; a TTL measurement on ``--ttl-eval-split`` has that one)."""
    seed: int = 0
    """Which of the ``--seeds`` runs (0 = the config as given; run i adds i to its seeds)."""
    exact: float = 0.0
    """Share of answers equal to a gold answer after normalisation (``accuracy`` also counts containment)."""
    judged: float | None = None
    """Share the paper's judge graded correct (``--metric judge``; None: not judged)."""

    def rate(self, metric: str) -> float | None:
        """The pass's accuracy by ``metric`` (``match``, ``exact`` or ``judge``; None: not judged)."""
        return {"match": self.accuracy, "exact": self.exact, "judge": self.judged}[metric]


def summarise(mode: str, epoch: int | None, predictions: list[Prediction], wall_seconds: float, *,
              is_learning: bool = False, num_updates: int = 0, split: str = "", seed: int = 0) -> PassResult:
    """A pass's averages from its predictions (in question order)."""
    count = max(len(predictions), 1)

    def mean(values: Any) -> float:
        return sum(values) / count

    return PassResult(mode, epoch, is_learning, mean(p.is_match for p in predictions),
                      mean(p.is_found for p in predictions), mean(p.num_tool_calls for p in predictions),
                      mean(p.num_tokens for p in predictions), wall_seconds / count, wall_seconds, predictions,
                      num_updates, split, seed, mean(p.is_exact for p in predictions),
                      mean(p.grade == "A" for p in predictions) if any(p.grade for p in predictions) else None)
