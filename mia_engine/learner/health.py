"""What test-time learning reports on ``/health``: how often its process died and was restarted, the latest
failure, and whether learning is off for good.

Learning never makes the server unhealthy: the Planner keeps serving its latest published version
without it, so ``LearningHealth`` is always ready and only adds an entry (``LearningState``) to the
answer once something failed.
"""

from __future__ import annotations

from typing import Literal

import msgspec



class LearningState(msgspec.Struct, frozen=True):
    """The ``learning`` entry of ``/health``, present once the learner failed."""

    status: Literal["restarted", "off"]
    """``restarted``: its process died and a fresh one took over; ``off``: no update runs any more (the
    restarts are spent, or a fresh learner could not be built); the served adapter stays."""
    num_restarts: int
    last_failure: str
    """One line without paths (the log has the whole error): e.g. how the process ended."""


class LearningHealth:
    """The learner's failures, counted; a component of ``/health`` (``server/health_api.py``)."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.num_restarts = 0
        self.last_failure = ""
        self.is_off = False

    def is_ready(self) -> bool:
        return True

    def not_ready_reason(self) -> str:
        return ""

    @property
    def can_restart(self) -> bool:
        return not self.is_off and self.num_restarts < self.max_restarts

    def restarted(self, failure: str) -> None:
        self.num_restarts += 1
        self.last_failure = failure

    def turned_off(self, failure: str) -> None:
        self.is_off = True
        self.last_failure = failure

    def health_entry(self) -> LearningState | None:
        """``/health``'s ``learning`` entry (None while nothing failed)."""
        if not (self.num_restarts or self.is_off):
            return None
        return LearningState("off" if self.is_off else "restarted", self.num_restarts, self.last_failure)
