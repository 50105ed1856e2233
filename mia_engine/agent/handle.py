"""Wiring of the research agent at server start: the shared encoder, the tools (the passage index is
built on first use, with a progress bar in the log) and the ``ResearchAgent`` over the engines and
memory. Until it is up, ``agent`` raises ``AgentUnavailable`` with the reason (the server answers 503)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..config import MIAConfig
from ..memory.embedder import Embedder
from ..base.readiness import StartupHandle
from ..tools.corpus import BuildProgress, index_root
from ..tools.image import ImageSearch
from ..tools.image_index import load_image_index
from ..tools.registry import Tools
from ..tools.search import LocalSearch
from ..tools.web import WebSearch
from .loop import OnLearn, ResearchAgent
from .stages import StageObserver

if TYPE_CHECKING:
    from ..memory.service import MemoryService

log = logging.getLogger(__name__)


class AgentUnavailable(RuntimeError):
    """The research agent is not up (starting, or failed to start); the message says why."""


class AgentHandle(StartupHandle[ResearchAgent]):
    unavailable = AgentUnavailable

    def __init__(self, config: MIAConfig, stages: StageObserver | None = None) -> None:
        super().__init__()
        self.config = config
        self.stages = stages
        """Sees every research-loop stage start and finish (the server's metrics)."""
        self._tools: Tools | None = None
        self._search: LocalSearch | None = None
        self.index_progress = BuildProgress()
        """The passage index build, while it runs (reported by /health and the 503 of ``mia``)."""

    async def prepare(self, encoder: Any) -> None:
        """Build the tools (local search loads its index, building it on first use); failures are kept.

        Runs concurrently with the engines' start: the index build is most of a first start."""
        try:
            self._tools = await self._build_tools(encoder)
        except Exception as err:
            # callers' 503 says the class only: the error's text may name server paths (the log has it)
            self.fail(f"the research agent's tools failed to start ({type(err).__name__}; see the server log)")
            log.exception("the research agent's tools failed to start")

    async def _build_tools(self, encoder: Any) -> Tools:
        """Local search over the configured corpus (index built once, cached), web and image search."""
        tools = self.config.tools
        loop = asyncio.get_running_loop()
        if tools.embedder != self.config.memory.embedder:
            encoder = await loop.run_in_executor(None, Embedder, tools.embedder)
        if tools.search_backend == "local":
            self._search = await loop.run_in_executor(None, LocalSearch.from_config, tools, encoder,
                                                      index_root(self.config), True, self.index_progress)
        web = WebSearch(tools) if tools.is_web_enabled else None
        local_images = await loop.run_in_executor(None, load_image_index, self.config)
        image = (ImageSearch(tools.image_cache_dir, tools.image_top_k, local_images)
                 if tools.image_cache_dir or local_images is not None else None)
        return Tools(tools, local=self._search, web=web, image=image)

    async def start(self, client: Any, memory: MemoryService, on_learn: OnLearn | None = None) -> None:
        """The agent over the prepared tools (``prepare`` first) and the open memory store."""
        if self._tools is None:
            return
        agent = ResearchAgent(client, memory, self._tools, self.config.agent, on_learn, self.stages)
        self._started(agent)
        log.info("research agent ready (model `mia`; %s)",
                 ", ".join(f"{concern}: {choice}" for concern, choice in agent.strategies.describe().items()))

    def close(self) -> None:
        if self._search is not None:
            self._search.close()

    def _starting_reason(self) -> str:
        if self._tools is None:
            return f"the research agent is starting ({self.index_progress.describe()}); retry shortly"
        return "the research agent is starting; retry shortly"

    def progress(self) -> str:
        """What ``/health`` may show anyone while the agent starts: the index build's counts and time left."""
        if self._error or self._tools is not None:
            return ""
        return self.index_progress.describe()

    def default_rollouts(self, learn: bool) -> int:
        """G when the request names none: the low-latency path's for a question that only asks, the
        learning G for one that learns (GRPO's advantage is relative to the group: a group of one
        carries no signal, so its update would always be rejected)."""
        return self.config.agent.num_rollouts if learn else self.config.agent.num_rollouts_low_latency

    @property
    def agent(self) -> ResearchAgent:
        """The agent; raises ``AgentUnavailable`` until it is up."""
        return self._component()
