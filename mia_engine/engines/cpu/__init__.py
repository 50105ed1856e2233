"""Everything the engines need only on vLLM's CPU platform, fenced in one package.

No product module imports it at module level, and a GPU start imports none of it
(``tests/engines/test_cpu_fence.py``). The rest of the code reaches it through one object,
``CpuPlatform`` (``serving.py``), which ``engines/platforms.py: resolve_platform`` builds where the engines
run on vLLM's CPU platform. vLLM reaches ``platform.py`` by qualname through the door outside the fence
(``engines/platforms.py: platform_plugin``, the ``vllm.platform_plugins`` entry point), and
``punica.py`` and ``worker.py`` by qualname from there.

    serving.py    CpuPlatform: the serving process's view of the CPU platform
    options.py    our keys in vLLM's additional_config (names, values, reader), the dtype ``auto`` asks for
    platform.py   vLLM's CPU platform, changed only for our engines (Punica wrapper, allocator, async
                  scheduling, worker)
    worker.py     vLLM's CPU worker, whose model runner rewinds a seeded request's generator on a CPU
    lora_ops.py   the grouped LoRA matmuls
    punica.py     vLLM's CPU Punica wrapper on those ops (the version guard; upstream/ holds the patch
                  that lets its rebinding go)
    spawn.py      the environment the engine's spawned processes inherit (KV cache, oneDNN bound, ``uni``)
    malloc.py     the allocator preload (TCMalloc)
    placement.py  this process off the model workers' cores

Host facts any CPU work reads are not here but in ``base/``: the CPU's flags (``base/cpu_features.py``)
and the oneDNN cache bound (``base/onednn.py``). Nor is the memory store's CPU score path
(``kernels/memory_score_cpu.py``, ``memory/blas.py``): a backend of the retrieval score beside its reference
and Triton kernel, chosen by ``memory.score_device``, independent of vLLM's platform.
"""

from __future__ import annotations

from .serving import CpuPlatform

__all__ = ["CpuPlatform"]
