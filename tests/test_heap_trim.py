"""The heap trimmer (``base/heap_trim.py``) gives back pages glibc's malloc holds free: memory a thread
freed below a block still in use, which ``free`` alone never returns. Real glibc, real RSS."""

from __future__ import annotations

import asyncio
import ctypes
import threading
from functools import cache

import pytest

from mia_engine.base.heap_trim import glibc_malloc_trim, resident_bytes, trim_heap, trim_heap_periodically

pytestmark = pytest.mark.skipif(glibc_malloc_trim() is None, reason="needs glibc")

BLOCK_BYTES = 2048
"""Below glibc's mmap threshold, so the blocks come from an arena's heap (as a server's small buffers do)."""
BLOCKS = 64 * 1024
"""128 MiB in all."""


@cache
def _libc() -> ctypes.CDLL:
    """This process's C library with ``malloc`` and ``free`` typed."""
    libc = ctypes.CDLL(None)
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    return libc


def _strand_freed_pages() -> list[int]:
    """On a thread of its own (its own arena), allocate and touch ``BLOCKS`` blocks, then free all but
    every 4096th: the freed pages stay resident behind the kept ones. Returns the kept blocks' addresses."""
    libc = _libc()
    kept: list[int] = []

    def run() -> None:
        blocks = [libc.malloc(BLOCK_BYTES) for _ in range(BLOCKS)]
        for address in blocks:
            ctypes.memset(address, 1, BLOCK_BYTES)
        for i, address in enumerate(blocks):
            if i % 4096 == 4095:
                kept.append(address)
            else:
                libc.free(address)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return kept


def _free(addresses: list[int]) -> None:
    for address in addresses:
        _libc().free(address)


def test_trim_gives_back_pages_freed_behind_a_live_block() -> None:
    trim_heap()  # free pages earlier tests left in an arena this thread may reuse would absorb its blocks
    before = resident_bytes()
    kept = _strand_freed_pages()
    try:
        stranded = resident_bytes() - before
        assert stranded > 64 * 2**20, "the freed blocks should still be resident before the trim"
        seconds, released = trim_heap()
        assert released > stranded // 2
        assert 0 < seconds < 5
    finally:
        _free(kept)


async def test_the_periodic_trimmer_trims_off_the_loop_and_reports_each_trim() -> None:
    trim_heap()  # as above: only this test's stranded pages are there to give back
    kept = _strand_freed_pages()
    trims: list[tuple[float, int]] = []
    task = asyncio.create_task(trim_heap_periodically(0.05, lambda *trim: trims.append(trim)))
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(trims) >= 2:
                break
    finally:
        task.cancel()
        _free(kept)
    assert len(trims) >= 2
    assert trims[0][1] > 32 * 2**20, "the first trim gives back the stranded pages"


async def test_interval_zero_never_trims() -> None:
    trims: list[tuple[float, int]] = []
    await asyncio.wait_for(trim_heap_periodically(0, lambda *trim: trims.append(trim)), timeout=1)
    assert trims == []
