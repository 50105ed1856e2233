"""A stand-in for the ``MemoryService`` while it opens behind the listening server.

Routes and the agent are built before the store is open (opening loads the encoder and replays the
journal); until then, and for good if opening failed, every call answers 503 with the reason.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .config import MemoryConfig
from .embedder import TextEncoder
from .entries import MemoryUnavailable
from .service import MemoryService

log = logging.getLogger(__name__)


class MemoryHandle:
    def __init__(self, data_dir: Path, config: MemoryConfig) -> None:
        self._data_dir = data_dir
        self._config = config
        self._service: MemoryService | None = None
        self._error: str | None = None

    async def open(self, encoder: TextEncoder | None = None) -> None:
        """Open the store (sharing ``encoder`` when given); a failure is kept as the 503 reason."""
        try:
            self._service = await MemoryService.open(self._data_dir, self._config, encoder=encoder)
            log.info("memory store open at %s (%d entries)", self._data_dir,
                     (await self._service.stats()).num_entries)
        except Exception as err:
            self._error = f"memory store failed to open: {type(err).__name__}: {err}"
            log.error("%s", self._error)

    async def close(self) -> None:
        if self._service is not None:
            await self._service.close()
            self._service = None

    def is_ready(self) -> bool:
        return self._service is not None

    def not_ready_reason(self) -> str:
        return self._error or "the memory store is opening; retry shortly"

    @property
    def service(self) -> MemoryService:
        if self._service is None:
            raise MemoryUnavailable(self.not_ready_reason())
        return self._service

    def __getattr__(self, name: str) -> Any:
        return getattr(self.service, name)
