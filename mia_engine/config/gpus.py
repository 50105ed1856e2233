"""The hardware a config is planned for (``[gpus]`` in the root config); used by the dry run only."""

from __future__ import annotations

from ..base.structs import Frozen


class GpusConfig(Frozen):
    """GPUs of this node (and of each Ray node) as the dry run budgets them."""

    num_gpus: int = 0
    """GPUs on this node; 0 = as many as the highest GPU id the config names, plus one."""
    memory_gib: float = 80.0
    """Memory of one GPU (an H100/A100-80GB reports about 79.2 GiB usable: set that to be exact)."""
    cuda_context_gib: float = 0.75
    """Per process and GPU outside vLLM's share: CUDA context, cuBLAS workspace, allocator slack. Counted
    once per GPU for the serving process (learner, encoder, memory index); vLLM's own is inside its
    ``gpu_memory_utilization`` share and is budgeted there."""
    gpus_per_node: int = 8
    """GPUs per node of a Ray cluster; tensor parallelism must stay within one node."""
    max_num_batched_tokens: int = 8192
    """Tokens of vLLM's profiling step for engines that leave ``max_num_batched_tokens`` at 0 (vLLM's
    default on an 80 GB GPU is 8192 for its API server, 16384 offline)."""

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or self.memory_gib <= 0 or self.cuda_context_gib < 0 or self.gpus_per_node < 1:
            raise ValueError("gpus: num_gpus >= 0, memory_gib > 0, cuda_context_gib >= 0, gpus_per_node >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("gpus.max_num_batched_tokens must be >= 1")
