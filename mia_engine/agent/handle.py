"""Wiring of the research agent at server start: the shared encoder, the tools (the passage index is
built on first use, with a progress bar in the log) and the ``ResearchAgent`` over the engines and
memory. Until it is up, model ``mia`` answers 503 with the reason."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..config import MIAConfig
from ..index import index_root
from ..memory.embedder import Embedder
from ..server.errors import Unavailable
from ..tools.image import ImageSearch
from ..tools.registry import Tools
from ..tools.search import LocalSearch
from ..tools.web import WebSearch
from .loop import OnLearn, ResearchAgent

log = logging.getLogger(__name__)


class AgentHandle:
    def __init__(self, config: MIAConfig) -> None:
        self.config = config
        self._agent: ResearchAgent | None = None
        self._search: LocalSearch | None = None
        self._error: str | None = None

    async def build_tools(self, encoder: Any) -> Tools:
        """Local search over the configured corpus (index built once, cached), web and image search."""
        tools = self.config.tools
        loop = asyncio.get_running_loop()
        if tools.embedder != self.config.memory.embedder:
            encoder = await loop.run_in_executor(None, Embedder, tools.embedder)
        if tools.search_backend == "local":
            self._search = await loop.run_in_executor(None, LocalSearch.from_config, tools, encoder,
                                                      index_root(self.config))
        web = WebSearch(tools) if tools.is_web_enabled else None
        image = ImageSearch(tools.image_cache_dir, tools.image_top_k) if tools.image_cache_dir else None
        return Tools(tools, local=self._search, web=web, image=image)

    async def start(self, client: Any, memory: Any, encoder: Any, on_learn: OnLearn | None = None) -> None:
        try:
            tools = await self.build_tools(encoder)
            self._agent = ResearchAgent(client, memory, tools, self.config.agent, on_learn)
            log.info("research agent ready (model `mia`)")
        except Exception as err:
            self._error = f"research agent failed to start: {type(err).__name__}: {err}"
            log.exception("research agent failed to start")

    def close(self) -> None:
        if self._search is not None:
            self._search.close()

    def is_ready(self) -> bool:
        return self._agent is not None

    def not_ready_reason(self) -> str:
        return self._error or "the research agent is starting; retry shortly"

    def default_rollouts(self) -> int:
        return self.config.agent.num_rollouts_low_latency

    @property
    def agent(self) -> ResearchAgent:
        if self._agent is None:
            raise Unavailable(self.not_ready_reason(), code="engine_not_ready")
        return self._agent
