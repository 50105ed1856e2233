"""The research agent while the server starts: the composition root (``services.py``) builds its tools (the
passage index is built on first use, with a progress bar in the log, its progress shown here) and then
starts the ``ResearchAgent`` over the engines, the memory and those tools. Until it is up, ``agent``
raises ``AgentUnavailable`` with the reason (the server answers 503)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..base.readiness import StartupHandle
from ..config import MIAConfig
from ..tools.corpus import BuildProgress
from ..tools.registry import Tools
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
        self.index_progress = BuildProgress()
        """The passage index build, while it runs (reported by /health and the 503 of ``mia``)."""

    def prepared(self, tools: Tools) -> None:
        """The tools are built (``start`` uses them)."""
        self._tools = tools

    def tools_failed(self, err: Exception) -> None:
        """The tools could not be built: callers' 503 names the error's class only (its text may name server
        paths; the log has it)."""
        self.fail(f"the research agent's tools failed to start ({type(err).__name__}; see the server log)")
        log.error("the research agent's tools failed to start", exc_info=err)

    async def start(self, client: Any, memory: MemoryService, on_learn: OnLearn | None = None) -> None:
        """The agent over the prepared tools (``prepared`` first) and the open memory store."""
        if self._tools is None:
            return
        agent = ResearchAgent(client, memory, self._tools, self.config.agent, on_learn, self.stages)
        self._started(agent)
        log.info("research agent ready (model `mia`; %s)",
                 ", ".join(f"{concern}: {choice}" for concern, choice in agent.strategies.describe().items()))

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
