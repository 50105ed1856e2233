"""How the engines come up in the serving process, correct by construction on a GPU box.

Three rules, each owned here:

1. **Workers spawn.** vLLM starts its engine-core and worker processes with
   ``multiprocessing.get_context(VLLM_WORKER_MULTIPROC_METHOD)`` and defaults to ``fork``; it switches to
   ``spawn`` by itself only when ``torch.cuda.is_initialized()`` is already true
   (``vllm.utils.system_utils._maybe_force_spawn``). FAISS-GPU or a CUDA driver call outside torch
   initialises CUDA without torch knowing, and a process forked after that cannot use CUDA.
   ``use_spawn`` sets the documented variable to ``spawn``; ``RoleServer`` calls it when it is built (in
   the main thread, before any engine starts), so every entry point that serves engines gets it.
2. **Nothing touches CUDA in this process before the engines are up.** ``cuda_components`` names the
   non-engine parts configured on a GPU (encoder, memory index, score kernel, learner); the service
   start-up runs the engines first whenever it is not empty (vLLM profiles free GPU memory at start).
3. **Placement through vLLM's own argument**: ``EngineConfig.devices`` becomes the engine's
   ``device_ids`` (vLLM ≥ 0.32, physical ids, or indices into ``CUDA_VISIBLE_DEVICES`` when that is set),
   never a process-wide ``CUDA_VISIBLE_DEVICES``. On vLLM's CPU platform a few settings are read only from
   the environment of the spawned child (``engines/cpu/spawn.py``); the platform's ``spawn_env`` asks the CPU package for
   them there and has none on a GPU. They are set from the event-loop thread around a group's start, and
   engines start together only when they need the same environment and disjoint GPUs (``start_groups``).
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..devices import serving_device_fields

if TYPE_CHECKING:
    from ..config import EngineConfig, MIAConfig

log = logging.getLogger(__name__)

GRAMMAR_CACHE_ENV = "VLLM_XGRAMMAR_CACHE_MB"
"""vLLM reads its xgrammar cache bound (MiB) only from the engine core's environment."""
MULTIPROC_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's engine-core process switch; "0" (``uni`` on a CPU) runs the engine in this process."""


def use_spawn(environ: dict[str, str] | None = None) -> None:
    """Make vLLM spawn (never fork) its processes; call once in the main thread before any engine starts."""
    environ = os.environ if environ is None else environ
    if environ.get(MULTIPROC_METHOD_ENV, "spawn") != "spawn":
        log.warning("%s=%s overridden to spawn: a forked worker cannot use CUDA once the parent touched it",
                    MULTIPROC_METHOD_ENV, environ[MULTIPROC_METHOD_ENV])
    environ[MULTIPROC_METHOD_ENV] = "spawn"


def cuda_components(config: MIAConfig) -> list[str]:
    """Config fields that put a non-engine component on a GPU of this process (empty: none does)."""
    fields = serving_device_fields(config)
    return [name for name, device in fields.items() if device == "auto" or device.startswith("cuda")]


@contextmanager
def applied_env(wanted: Mapping[str, str]) -> Iterator[None]:
    """Set ``wanted`` for the duration of a group's spawns, then restore; one group at a time."""
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def process_state_kept(env: Mapping[str, str]) -> Iterator[None]:
    """Undo what vLLM's start-up writes into this process while a group of engines starts: environment
    variables (its CPU platform sets ``LD_PRELOAD``, ``LOCAL_WORLD_SIZE``, ...; on a GPU its in-process
    executor sets ``OMP_NUM_THREADS``) and torch's intra-op thread count (lowered and restored around each
    engine's spawn). Each start sets and restores these process-wide, so starts running in parallel
    threads interleave, and whichever restores last leaves its value behind. The engines' own processes
    have inherited what they need by the time the group is up. An engine that runs in this process
    (``uni`` on a CPU: the group's spawn ``env`` turns multiprocessing off) keeps the thread count its
    model set."""
    environ, num_threads = dict(os.environ), _torch_threads()
    try:
        yield
    finally:
        changed = sorted(k for k in set(environ) | set(os.environ) if environ.get(k) != os.environ.get(k))
        os.environ.clear()
        os.environ.update(environ)
        is_in_process = env.get(MULTIPROCESSING_ENV) == "0"
        if num_threads is not None and not is_in_process and _torch_threads() != num_threads:
            import torch

            torch.set_num_threads(num_threads)
            changed.append("torch.get_num_threads()")
        if changed:
            log.debug("restored what the engines' start changed in this process: %s", ", ".join(changed))


def _torch_threads() -> int | None:
    """torch's intra-op thread count, where torch is already imported (nothing to keep otherwise)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def engine_env(engine: EngineConfig) -> dict[str, str]:
    """What every engine's spawned processes read from the environment on any platform (the platform's
    ``spawn_env`` adds its own): the bound on the engine core's compiled-grammar cache."""
    return {GRAMMAR_CACHE_ENV: str(engine.structured_outputs_cache_mib)}


def start_groups(engines: Mapping[str, EngineConfig], envs: Mapping[str, Mapping[str, str]]) -> list[list[str]]:
    """Engines that may start concurrently, group by group, in config order.

    Two engines share a group only when they need the same spawn environment (``envs``, by engine: the
    platform's ``spawn_env``) and both name their GPUs and the sets are disjoint: vLLM sizes its KV cache from the
    free memory it measures at start, so an engine starting on a GPU another one is filling would size
    it wrong. No ``devices`` means the default device set (or the CPU): such an engine starts on its own.
    """
    groups: list[list[str]] = []
    for name, engine in engines.items():
        for group in groups:
            if all(_can_start_together(engine, engines[other]) and envs[name] == envs[other] for other in group):
                group.append(name)
                break
        else:
            groups.append([name])
    return groups


def _can_start_together(a: EngineConfig, b: EngineConfig) -> bool:
    if not a.devices or not b.devices or a.executor_backend == "ray" or b.executor_backend == "ray":
        return False
    return not set(a.devices) & set(b.devices)


def replica_for(key: str, num_replicas: int) -> int:
    """The data-parallel replica of an affinity key: stable across processes and restarts (CRC-32, not
    Python's salted ``hash``), so every turn of one rollout reaches the replica holding its prefix."""
    return zlib.crc32(key.encode()) % num_replicas
