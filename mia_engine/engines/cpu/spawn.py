"""The environment a CPU engine's spawned processes must inherit: the settings vLLM's CPU platform reads
only from the environment of its engine-core and worker processes, set around the engine's start by
``engines/startup.py`` (``applied_env``). ``LD_PRELOAD`` is not here: vLLM's CPU platform edits it
itself while it builds the engine's config, so the allocator is added there (``malloc.py``, called by
``platform.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...base.onednn import onednn_cache_env

if TYPE_CHECKING:
    from ...config import EngineConfig

KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU KV-cache size, in GiB (``CpuEngineConfig.kv_cache_space_gib``)."""
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's engine-core process switch; "0" runs the engine core (and with ``uni`` the model) in this process."""


def spawn_env(engine: EngineConfig, onednn_cache_capacity: int) -> dict[str, str]:
    """The KV cache size, the bound on oneDNN's primitive caches (``cpu.onednn_cache_capacity``), and
    for ``executor_backend = "uni"`` the engine core in this process: vLLM's CPU platform turns ``uni``
    into ``mp`` unless multiprocessing is off."""
    wanted = {KV_CACHE_ENV: str(max(1, round(engine.cpu.kv_cache_space_gib))),
              **onednn_cache_env(onednn_cache_capacity)}
    if engine.executor_backend == "uni":
        wanted[MULTIPROCESSING_ENV] = "0"
    return wanted
