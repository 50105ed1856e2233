"""Giving the pages glibc's malloc holds free back to the system, every so often (``server.malloc_trim_interval_s``).

glibc keeps memory a thread freed in that thread's arena, for reuse, and returns it to the system only
from the top of an arena's heap. So after a burst (the corpus index built at a first start, a large
memory import, the encoder's and the learner's batches) the serving process would keep the burst's free
pages resident: reused, never returned. ``malloc_trim(0)`` hands every whole free page of every arena
back (``madvise``), keeping the arenas themselves; partly used pages stay. It runs on a worker thread:
it takes each arena's lock in turn, so a thread allocating from that arena waits out that arena's walk.

Only glibc has it: under another C library the trimmer does nothing, and under a preloaded allocator
(TCMalloc, jemalloc) glibc's arenas hold nothing to trim.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import time
from collections.abc import Callable
from functools import cache

log = logging.getLogger(__name__)

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@cache
def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim(pad)`` of this process (it releases the GIL while it runs), or None where the
    C library is not glibc."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "malloc_trim"):
        return None
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def resident_bytes() -> int:
    """This process's resident set size, in bytes (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def trim_heap() -> tuple[float, int]:
    """Trim glibc's arenas once: (seconds it took, bytes of RSS it gave back). Blocking: call it off the
    event loop."""
    trim = glibc_malloc_trim()
    if trim is None:
        return 0.0, 0
    before = resident_bytes()
    start = time.perf_counter()
    trim(0)
    return time.perf_counter() - start, max(0, before - resident_bytes())


async def trim_heap_periodically(interval_s: float, observe: Callable[[float, int], None]) -> None:
    """Every ``interval_s`` seconds, ``trim_heap`` on a worker thread and ``observe(seconds, released
    bytes)``, until cancelled. Returns at once where ``interval_s`` is 0 or the C library is not glibc."""
    if interval_s <= 0:
        return
    if glibc_malloc_trim() is None:
        log.info("server.malloc_trim_interval_s: this C library is not glibc; nothing to trim")
        return
    while True:
        await asyncio.sleep(interval_s)
        seconds, released = await asyncio.to_thread(trim_heap)
        observe(seconds, released)
        log.debug("malloc_trim gave back %.1f MB of RSS in %.3f s", released / 2**20, seconds)
