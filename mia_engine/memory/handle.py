"""A stand-in for the ``MemoryService`` while it opens behind the listening server.

Routes and the agent are built before the store is open (opening loads the encoder and replays the
journal); until then, and for good if opening failed, every call raises ``MemoryUnavailable`` with the
reason (the routes answer 503). The handle declares the service methods its users call (the memory routes,
the research loop, ``Services``), each typed as the service's and delegated once the store is open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..readiness import StartupHandle
from .config import MemoryConfig
from .embedder import TextEncoder
from .entries import (AddResult, ClearResult, ConsolidationResult, MemoryEntry, MemoryStats, MemoryUnavailable,
                      MetaPlanHit, Modality, SearchResult, StoredRecord, SummarisedRollout)
from .service import MemoryService, NewMemory

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

    # ---- what the memory routes, the research loop and ``Services`` call (``MemoryService``'s) ----------

    @property
    def config(self) -> MemoryConfig:
        return self.service.config

    async def add(self, memory: NewMemory) -> AddResult:
        return await self.service.add(memory)

    async def search(self, question: str, *, caption: str | None = None, category: str | None = None,
                     modality: Modality | None = None, num_positive: int | None = None,
                     num_negative: int | None = None) -> SearchResult:
        return await self.service.search(question, caption=caption, category=category, modality=modality,
                                         num_positive=num_positive, num_negative=num_negative)

    async def get(self, entry_id: str) -> MemoryEntry:
        return await self.service.get(entry_id)

    async def delete(self, entry_id: str) -> None:
        await self.service.delete(entry_id)

    async def record_outcome(self, used_ids: Iterable[str], success: bool) -> int:
        return await self.service.record_outcome(used_ids, success)

    async def consolidate_group(self, question: str, rollouts: Sequence[SummarisedRollout], *,
                                caption: str | None = None, category: str | None = None,
                                modality: Modality | None = None) -> ConsolidationResult:
        return await self.service.consolidate_group(question, rollouts, caption=caption, category=category,
                                                    modality=modality)

    async def clear_after_update(self) -> ClearResult:
        return await self.service.clear_after_update()

    async def search_meta_plans(self, question: str, k: int | None = None) -> list[MetaPlanHit]:
        return await self.service.search_meta_plans(question, k)

    async def export_records(self) -> list[StoredRecord]:
        return await self.service.export_records()

    async def import_records(self, records: Sequence[StoredRecord]) -> int:
        return await self.service.import_records(records)

    async def import_jsonl(self, data: bytes) -> int:
        return await self.service.import_jsonl(data)

    async def stats(self) -> MemoryStats:
        return await self.service.stats()
