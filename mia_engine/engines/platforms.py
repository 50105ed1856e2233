"""Which vLLM platform the engines run on, and vLLM's door to this package's CPU platform.

The door stays outside ``engines/cpu/``: vLLM imports every ``vllm.platform_plugins`` entry point's
module in each process it starts, on every build, and asks it whether it applies; on a GPU build the
answer is None and the CPU package stays unimported. Like vLLM's own ``vllm/platforms/__init__.py``,
it names the platform class by qualname and leaves importing it to vLLM.
"""

from __future__ import annotations

CPU_PLATFORM = "mia_engine.engines.cpu.platform.MIACpuPlatform"
"""vLLM's CPU platform with the per-engine choices of ``engines/cpu/options.py``."""


def platform_plugin() -> str | None:
    """The ``vllm.platform_plugins`` entry point: on a CPU build of vLLM, ``CPU_PLATFORM``; elsewhere (a
    GPU build) None, so vLLM detects its own platform. vLLM calls it while it resolves
    ``current_platform``, so it imports nothing that needs one."""
    from vllm.platforms import cpu_platform_plugin

    return CPU_PLATFORM if cpu_platform_plugin() is not None else None


def is_cpu_platform() -> bool:
    """Whether vLLM runs the engines on its CPU platform here (vLLM's own choice, ``current_platform``)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
