"""vLLM's CPU platform as the serving process sees it (a ``Platform`` of ``engines/platforms.py``): each engine's
extra engine args (``options.py``) and spawn environment (``spawn.py``), and this process kept off the
model workers' cores once they are up (``placement.py``, with ``cpu.keep_off_model_cores``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .options import engine_args
from .placement import keep_off_model_cores
from .spawn import spawn_env

if TYPE_CHECKING:
    from ...config import EngineConfig
    from ...config.cpu import CpuConfig


class CpuPlatform:
    """vLLM's CPU build, with the ``[cpu]`` and ``[engines.<name>.cpu]`` settings applied."""

    name = "cpu"

    def __init__(self, config: CpuConfig) -> None:
        self.config = config

    def engine_args(self, engine: EngineConfig) -> dict[str, Any]:
        return engine_args(engine)

    def spawn_env(self, engine: EngineConfig) -> dict[str, str]:
        return spawn_env(engine, self.config.onednn_cache_capacity)

    def after_engines_up(self) -> None:
        if self.config.keep_off_model_cores:  # after the passage index, whose build uses every core
            keep_off_model_cores()
