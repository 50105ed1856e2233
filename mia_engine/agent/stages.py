"""Stage timing of the research loop: what ``/metrics`` and the benchmarks' breakdowns read.

Every stage of a question (caption, retrieve, plan, route, judge, consolidate, learn) and every step
inside a rollout (an Executor turn, a tool call, a reflection, a replan) is timed by one
``StageTimer``; an observer (the server's Prometheus metrics) sees each stage start and finish, so
in-flight gauges and latency histograms come from the same clock as the per-request ``timings``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

STAGES = ("caption", "retrieve", "closed_book", "plan", "route", "execute", "execute_turn", "tool_call",
          "evidence_answer", "reflect", "replan", "judge", "consolidate", "learn")
"""Every stage name the loop reports (``execute`` is all G rollouts of a question; ``execute_turn`` one
Executor generation; ``closed_book`` the Manager's answer without tools, beside the others; ``learn``
hands the judged rollouts to the learner)."""


class StageObserver(Protocol):
    def stage_started(self, stage: str) -> None: ...

    def stage_finished(self, stage: str, seconds: float) -> None: ...


class StageTimer:
    """``with timer("stage"):`` times the block for the observer and, when given, adds it to ``timings``."""

    def __init__(self, observer: StageObserver | None = None, timings: dict[str, float] | None = None) -> None:
        self.observer = observer
        self.timings = timings

    def for_request(self, timings: dict[str, float]) -> StageTimer:
        """The same observer, adding to one request's ``timings``."""
        return StageTimer(self.observer, timings)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        if self.observer is not None:
            self.observer.stage_started(stage)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            if self.timings is not None:
                self.timings[stage] = self.timings.get(stage, 0.0) + seconds
            if self.observer is not None:
                self.observer.stage_finished(stage, seconds)
