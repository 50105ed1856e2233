"""The ``[engines.<name>.vllm]`` table: vLLM engine arguments passed through as given, checked first.

Each key must be a field of vLLM's own ``EngineArgs`` (the installed version's), and must not be one the
engine already sets from an ``EngineConfig`` field (one place sets each thing). The check runs before any
engine starts (``serve``'s preflight) and again when an engine builds its args, so every entry point
gets the same one-line error naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import MIAConfig

OWN_KEYS: Mapping[str, str] = {
    "model": "model", "dtype": "dtype", "max_model_len": "max_model_len",
    "gpu_memory_utilization": "gpu_memory_utilization", "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size", "data_parallel_size": "data_parallel_size",
    "device_ids": "devices", "enforce_eager": "enforce_eager", "enable_prefix_caching": "enable_prefix_caching",
    "block_size": "block_size", "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "language_model_only": "language_model_only", "limit_mm_per_prompt": "max_images_per_prompt",
    "enable_lora": "enable_lora", "max_lora_rank": "max_lora_rank", "max_loras": "max_loras",
    "max_cpu_loras": "max_cpu_loras", "seed": "seed", "distributed_executor_backend": "executor_backend",
    "structured_outputs_config": "structured_outputs_backend", "additional_config": "cpu_*",
}
"""vLLM engine argument -> the ``EngineConfig`` field it is set from (``additional_config``: the CPU fields)."""

SET_BY_ENGINE: Mapping[str, str] = {
    "served_model_name": "the engine's name is its model id",
    "disable_log_stats": "vLLM's stat loggers are always on (they feed /metrics)",
}
"""vLLM engine arguments the engine sets itself, with why."""


def engine_arg_names() -> frozenset[str]:
    """The fields of the installed vLLM's ``EngineArgs`` (imports vLLM's argument module)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(field.name for field in dataclasses.fields(AsyncEngineArgs))


def vllm_version() -> str:
    from vllm import __version__

    return __version__


def table_error(name: str, table: Mapping[str, Any], known: Collection[str], version: str) -> str | None:
    """The first bad key of engine ``name``'s ``vllm`` table as a one-line error, or None when all are good."""
    for key in table:
        field = f"engines.{name}.vllm.{key}"
        if key in OWN_KEYS:
            return f"{field}: set by engines.{name}.{OWN_KEYS[key]}; set that field instead"
        if key in SET_BY_ENGINE:
            return f"{field}: set by the engine ({SET_BY_ENGINE[key]})"
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"{field}: not an engine argument of vLLM {version}{hint}"
    return None


def check_engine_tables(config: MIAConfig) -> None:
    """Raise ``ValueError`` naming the first bad ``engines.<name>.vllm`` key of ``config``."""
    tables = {name: engine.vllm for name, engine in config.engines.items() if engine.vllm}
    if not tables:
        return
    known, version = engine_arg_names(), vllm_version()
    for name, table in tables.items():
        error = table_error(name, table, known, version)
        if error is not None:
            raise ValueError(error)
