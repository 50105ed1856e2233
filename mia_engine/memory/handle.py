"""The server's memory while it opens: routes are mounted before the store is open (opening loads the
encoder and replays the journal), so they hold this handle and ask it for the ``MemoryService`` on each
request. Until the store is open, and for good if opening failed, ``service`` raises
``MemoryUnavailable`` with the reason (the routes answer 503). The research loop is started only once
the store is open and gets the service itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..base.readiness import StartupHandle
from ..config.memory import MemoryConfig
from .embedder import TextEncoder
from .entries import MemoryUnavailable
from .service import MemoryService

log = logging.getLogger(__name__)


class MemoryHandle(StartupHandle[MemoryService]):
    unavailable = MemoryUnavailable

    def __init__(self, data_dir: Path, config: MemoryConfig) -> None:
        super().__init__()
        self._data_dir = data_dir
        self._config = config

    async def open(self, encoder: TextEncoder | None = None) -> None:
        """Open the store (sharing ``encoder`` when given); a failure is kept as the 503 reason."""
        try:
            service = await MemoryService.open(self._data_dir, self._config, encoder=encoder)
            self._started(service)
            log.info("memory store open at %s (%d entries)", self._data_dir, (await service.stats()).num_entries)
        except Exception as err:
            self.fail(f"memory store failed to open: {type(err).__name__}: {err}")
            log.error("%s", self._error)

    async def close(self) -> None:
        if self._started_component is not None:
            await self._started_component.close()
            self._started(None)

    def _starting_reason(self) -> str:
        return "the memory store is opening; retry shortly"

    @property
    def service(self) -> MemoryService:
        """The open service; raises ``MemoryUnavailable`` until it is open."""
        return self._component()
