"""What an engine on vLLM's CPU platform is started with beyond a GPU engine's: its keys in vLLM's
``additional_config`` (names, values, the writer and the reader that validates them) and the dtype that
``auto`` means on this CPU. The one owner of these keys.

vLLM hands ``additional_config`` (an engine's own config) to its platform unread; ``platform.py`` reads
our keys from it in each process vLLM starts for that engine. A config without them (a plain ``vllm
serve``, or another vLLM program in this environment) keeps vLLM's own choices, the dtype included:
only the engines this project starts ask for float32 (``engine_dtype``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...base.cpu_features import cpu_flags, emulates_bf16

if TYPE_CHECKING:
    from ...config import EngineConfig

LORA_OPS_KEY = "mia_cpu_lora_ops"
"""``CpuEngineConfig.lora_ops``: ``grouped`` builds the grouped Punica wrapper (``punica.py``)."""
MALLOC_KEY = "mia_cpu_malloc"
"""``CpuEngineConfig.malloc``: ``tcmalloc`` preloads the system's TCMalloc in the engine's processes."""
ASYNC_SCHEDULING_KEY = "mia_cpu_async_scheduling"
"""``CpuEngineConfig.async_scheduling``: true undoes the CPU platform's ``async_scheduling = False``."""

ALLOWED: Mapping[str, tuple[object, ...]] = {
    LORA_OPS_KEY: ("vllm", "grouped"),
    MALLOC_KEY: (None, "tcmalloc", "glibc"),
    ASYNC_SCHEDULING_KEY: (False, True),
}
"""Each key's values; the first is what a config without the key gets (vLLM's own behaviour)."""


def additional_config(engine: EngineConfig) -> dict[str, str | bool]:
    """The engine's choices, under our keys, for vLLM's ``additional_config``."""
    return {LORA_OPS_KEY: engine.cpu.lora_ops, MALLOC_KEY: engine.cpu.malloc,
            ASYNC_SCHEDULING_KEY: engine.cpu.async_scheduling}


def is_ours(additional: object) -> bool:
    """Whether vLLM's ``additional_config`` (``additional``) is one this project wrote: an engine it starts."""
    return isinstance(additional, dict) and all(key in additional for key in ALLOWED)


def read_option(additional: object, key: str) -> object:
    """An engine's choice for ``key`` in vLLM's ``additional_config`` (``additional``); without the key,
    the first allowed value. Anything else is refused, a value of another type too (``1`` is not ``True``)."""
    allowed = ALLOWED[key]
    choice = additional.get(key, allowed[0]) if isinstance(additional, dict) else allowed[0]
    if not any(type(choice) is type(value) and choice == value for value in allowed):
        raise ValueError(f"additional_config[{key!r}] = {choice!r}: expected "
                         + " or ".join(repr(value) for value in allowed if value is not None))
    return choice


def engine_dtype(configured: str, flags: frozenset[str]) -> str:
    """The dtype the engine asks vLLM for: as configured, except ``auto`` on a CPU that would only emulate
    bfloat16 (``features.emulates_bf16``), which asks for float32. vLLM's CPU platform resolves ``auto``
    to bfloat16 on every x86 CPU, and oneDNN's emulated bf16 measured several times slower than float32
    there; a configured dtype always wins."""
    return "float32" if configured == "auto" and emulates_bf16(flags) else configured


def engine_args(engine: EngineConfig) -> dict[str, object]:
    """The engine args of a CPU engine that differ from a GPU engine's: the dtype, the KV cache size
    (``EngineConfig.cpu_kv_cache_bytes``) and our keys."""
    return {"dtype": engine_dtype(engine.dtype, cpu_flags()), "kv_cache_memory_bytes": engine.cpu_kv_cache_bytes(),
            "additional_config": additional_config(engine)}
