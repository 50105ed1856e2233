"""The environment a CPU engine's spawned processes must inherit: the settings vLLM's CPU platform reads
only from the environment of its engine-core and worker processes, set around the engine's start by
``engines/startup.py`` (``applied_env``). ``LD_PRELOAD`` is not here: vLLM's CPU platform edits it
itself while it builds the engine's config, so the allocator is added there (``malloc.py``, called by
``platform.py``).

An engine whose replica runs several model workers (tensor x pipeline parallel) also gets their cores
(``omp_threads_bind``) where vLLM's automatic binding cannot place them: it gives each worker a NUMA node
of its own and refuses to start with fewer nodes than workers ("Not enough allowed NUMA nodes to bind
threads of 2 local CPUWorkers"), which is every one-socket machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...base.onednn import onednn_cache_env

if TYPE_CHECKING:
    from ...config import EngineConfig

MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's engine-core process switch; "0" runs the engine core (and with ``uni`` the model) in this process."""
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's cores of each model worker of an engine, ``|`` between workers (data-parallel replica by replica,
each replica's ranks in order), ``,`` and ``-`` within; ``auto`` (vLLM's default): one NUMA node per worker."""


def spawn_env(engine: EngineConfig, onednn_cache_capacity: int) -> dict[str, str]:
    """The bound on oneDNN's primitive caches (``cpu.onednn_cache_capacity``), and
    for ``executor_backend = "uni"`` the engine core in this process: vLLM's CPU platform turns ``uni``
    into ``mp`` unless multiprocessing is off; for several workers a replica, their cores where vLLM's
    automatic binding refuses them (``omp_threads_bind``)."""
    wanted = dict(onednn_cache_env(onednn_cache_capacity))
    if engine.executor_backend == "uni":
        wanted[MULTIPROCESSING_ENV] = "0"
    if num_workers(engine) > 1 and OMP_BIND_ENV not in os.environ:  # an operator's own binding stands
        bind = omp_threads_bind(engine, *host_cores())
        if bind:
            wanted[OMP_BIND_ENV] = bind
    return wanted


def num_workers(engine: EngineConfig) -> int:
    """Model workers of one replica of ``engine``: tensor x pipeline parallel."""
    return engine.tensor_parallel_size * engine.pipeline_parallel_size


def omp_threads_bind(engine: EngineConfig, cores: Sequence[int], num_numa_nodes: int) -> str:
    """``OMP_BIND_ENV`` for ``engine`` on ``cores`` (one CPU id per physical core) of ``num_numa_nodes``
    nodes, where vLLM's automatic binding refuses it (more workers per replica than nodes); empty where
    that binding places them. Each worker of a replica gets an equal slice of the cores, less its last
    core, left to the engine core and this process as vLLM's own binding leaves one core per worker;
    with fewer cores than workers they take turns on them. Every replica gets the same slices, as vLLM's
    automatic binding gives every single-worker replica the same cores."""
    num_ranks = num_workers(engine)
    if num_ranks == 1 or num_numa_nodes >= num_ranks or not cores:
        return ""
    size = len(cores) // num_ranks
    if size == 0:
        slices = [[cores[rank % len(cores)]] for rank in range(num_ranks)]
    else:
        kept = size - 1 if size > 1 else size
        slices = [list(cores[rank * size:rank * size + kept]) for rank in range(num_ranks)]
    return "|".join([",".join(map(str, cpus)) for cpus in slices] * engine.data_parallel_size)


def host_cores() -> tuple[list[int], int]:
    """(one CPU id per physical core this process may run on, by node and core; the NUMA nodes it may
    allocate on), as vLLM's CPU worker reads them (``vllm.utils.cpu_resource_utils``)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_visible_memory_node

    first: dict[tuple[int, int], int] = {}
    for cpu in sorted(get_allowed_cpu_list(), key=lambda cpu: (cpu.numa_node, cpu.physical_core, cpu.id)):
        first.setdefault((cpu.numa_node, cpu.physical_core), cpu.id)
    return list(first.values()), len(get_visible_memory_node())
