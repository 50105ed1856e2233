"""The two caches of oneDNN primitives a CPU process keeps, and their bound (``cpu.onednn_cache_capacity``).

torch runs a bf16 matmul on CPU through oneDNN and keeps the primitive it built twice: in ideep's LRU
cache (``LRU_CACHE_CAPACITY``) and in oneDNN's own process-wide cache
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), 1024 entries each by default. A primitive is built per input
shape, and serving changes the shape every step (tokens in a step, passages in an encoder batch), so a
bf16 process keeps adding large primitives until both caches are full; with
both bounded its memory stays flat. A float32 sentence encoder fed batches of changing shape fills them
too, with smaller primitives. Both values
are read once per process, at its first oneDNN primitive, so they must be in the environment before
that: ``spawn.spawn_env`` for the engines' spawned processes, ``bound_this_process`` for the serving
(or ``eval``) process at its start.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
"""oneDNN's process-wide primitive cache size."""
IDEEP_CACHE_ENV = "LRU_CACHE_CAPACITY"
"""The size of ideep's LRU cache of primitives, torch's layer over oneDNN."""


def onednn_cache_env(capacity: int) -> dict[str, str]:
    """The environment that bounds both caches at ``capacity`` primitives. 0 turns oneDNN's off; ideep's
    keeps one entry then, because torch's bf16 matmul crashes (SIGSEGV) with ``LRU_CACHE_CAPACITY=0``."""
    return {ONEDNN_CACHE_ENV: str(capacity), IDEEP_CACHE_ENV: str(max(1, capacity))}


def bound_this_process(capacity: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Bound this process's caches; call before its first oneDNN op (both are read then, not later)."""
    (os.environ if environ is None else environ).update(onednn_cache_env(capacity))
