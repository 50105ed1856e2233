"""Everything the engines need only on vLLM's CPU platform, fenced in one package.

No product module imports it at module level, and a GPU start imports none of it
(``tests/engines/test_cpu_fence.py``). The rest of the code reaches it through the names below, imported
inside a function where the engines run on vLLM's CPU platform (``engines/platforms.py:
is_cpu_platform``) or where a config asks for CPU work (``cpu_keep_off_model_cores``; an encoder or
learner on the CPU). vLLM reaches ``platform.py`` by qualname through the door outside the fence
(``engines/platforms.py: platform_plugin``, the ``vllm.platform_plugins`` entry point), and
``punica.py`` and ``worker.py`` by qualname from there.

    options.py    our keys in vLLM's additional_config (names, values, reader), the dtype ``auto`` asks for
    platform.py   vLLM's CPU platform, changed only for our engines (Punica wrapper, allocator, async
                  scheduling, worker)
    worker.py     vLLM's CPU worker, whose model runner rewinds a seeded request's generator on a CPU
    lora_ops.py   the grouped LoRA matmuls
    punica.py     vLLM's CPU Punica wrapper on those ops (the version guard; upstream/ holds the patch
                  that lets its rebinding go)
    spawn.py      the environment the engine's spawned processes inherit (KV cache, oneDNN bound, ``uni``)
    malloc.py     the allocator preload (TCMalloc)
    onednn.py     the bound on oneDNN's primitive caches
    features.py   the CPU's flags (where bfloat16 is native)
    placement.py  this process off the model workers' cores

Not here: the memory store's CPU score path (``kernels/memory_score_cpu.py``, ``memory/blas.py``). It is a
backend of the retrieval score beside its reference and Triton kernel, chosen by ``memory.score_device``,
which is independent of vLLM's platform (a GPU deployment may score a small store on the CPU).
"""

from __future__ import annotations

from .features import cpu_flags, has_native_bf16
from .onednn import bound_this_process
from .options import engine_args
from .placement import keep_off_model_cores
from .spawn import spawn_env

__all__ = ["bound_this_process", "cpu_flags", "engine_args", "has_native_bf16", "keep_off_model_cores",
           "spawn_env"]
