"""The platform the engines run on, decided once per process, and vLLM's door to this package's CPU platform.

``resolve_platform`` asks vLLM which platform it runs on (its own ``current_platform``) and returns the one
object that says what our engines need there: ``GpuPlatform`` (CUDA: nothing beyond vLLM's own) or
``CpuPlatform`` (``engines/cpu/serving.py``: the engine args, spawn environment and core placement of
vLLM's CPU build). The composition root resolves it and hands it to the engines; nothing else asks.

The door (``platform_plugin``) stays outside ``engines/cpu/``: vLLM imports every ``vllm.platform_plugins``
entry point's module in each process it starts, on every build, and asks it whether it applies; on a GPU
build the answer is None and the CPU package stays unimported. Like vLLM's own
``vllm/platforms/__init__.py``, it names the platform class by qualname and leaves importing it to vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..base.parent_watch import watch_parent

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..config.cpu import CpuConfig

CPU_PLATFORM = "mia_engine.engines.cpu.platform.MIACpuPlatform"
"""vLLM's CPU platform with the per-engine choices of ``engines/cpu/options.py``."""


class Platform(Protocol):
    """What our engines need from the platform vLLM runs them on, beyond vLLM's own handling of it."""

    name: str

    def engine_args(self, engine: EngineConfig) -> dict[str, Any]:
        """vLLM engine args this platform adds to an engine's (they win over the engine's own)."""

    def spawn_env(self, engine: EngineConfig) -> dict[str, str]:
        """Environment the engine's spawned processes must inherit (vLLM reads these nowhere else)."""

    def after_engines_up(self) -> None:
        """Called once every engine is up and the passage index built."""


class GpuPlatform:
    """vLLM's CUDA platform: vLLM places, sizes and spawns everything; nothing of ours is added."""

    name = "cuda"

    def engine_args(self, engine: EngineConfig) -> dict[str, Any]:
        return {}

    def spawn_env(self, engine: EngineConfig) -> dict[str, str]:
        return {}

    def after_engines_up(self) -> None:
        return None


def resolve_platform(cpu: CpuConfig) -> Platform:
    """The platform of this process's engines, as vLLM decided it (``current_platform``); ``cpu``: the
    ``[cpu]`` section, read only on vLLM's CPU platform."""
    if not is_cpu_platform():
        return GpuPlatform()
    from .cpu import CpuPlatform

    return CpuPlatform(cpu)


def platform_plugin() -> str | None:
    """The ``vllm.platform_plugins`` entry point: on a CPU build of vLLM, ``CPU_PLATFORM``; elsewhere (a
    GPU build) None, so vLLM detects its own platform. vLLM calls it while it resolves
    ``current_platform``, so it imports nothing that needs one. It is also the earliest call of ours in
    each process vLLM spawns (the child resolves the platform while it imports its entry point), so it
    starts that process's watch on its parent (``base/parent_watch.py``) first, on every build."""
    from vllm.platforms import cpu_platform_plugin

    watch_parent()

    return CPU_PLATFORM if cpu_platform_plugin() is not None else None


def is_cpu_platform() -> bool:
    """Whether vLLM runs the engines on its CPU platform here (vLLM's own choice, ``current_platform``)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
