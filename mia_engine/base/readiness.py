"""What the start-up handles share (``memory/handle.py: MemoryHandle``, ``agent/handle.py: AgentHandle``): a
component built before it can work, since it starts behind the listening server, and until then (for good
if starting failed) every use raises the component's ``Unavailable`` error with the reason (503).

Part of the config layer (it imports nothing of the package), so the memory and the agent can both build
on it. ``/health`` looks up ``progress()`` on the handle's class: a handle with public progress defines it.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class StartupHandle(Generic[T]):
    """Holds the component once it is up (``_started``) or why it is not (``fail``)."""

    unavailable: type[Exception] = RuntimeError
    """Raised by ``_component()`` until the component is up; the server maps it to a 503."""

    def __init__(self) -> None:
        self._started_component: T | None = None
        self._error: str | None = None

    def is_ready(self) -> bool:
        return self._started_component is not None

    def not_ready_reason(self) -> str:
        """Why it is not ready: the start-up failure if there was one, else that it is still starting."""
        return self._error or self._starting_reason()

    def fail(self, reason: str) -> None:
        """The component cannot start: ``reason`` is then every caller's 503 (``/health`` shows no reasons)."""
        self._error = reason

    def _starting_reason(self) -> str:
        """What ``not_ready_reason`` says while the component is still starting (no failure yet)."""
        return "starting; retry shortly"

    def _started(self, component: T | None) -> None:
        """The component is up (None: down again, e.g. closed)."""
        self._started_component = component

    def _component(self) -> T:
        """The component; raises ``unavailable`` with ``not_ready_reason()`` until it is up."""
        if self._started_component is None:
            raise self.unavailable(self.not_ready_reason())
        return self._started_component
