"""The coalescer that batches concurrent memory searches onto the store thread and local searches into
one encoder forward."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from mia_engine.base.coalesce import Coalescer


class Doubler:
    """``run``: doubles each item, records every batch, refuses negatives, may block until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.release.wait(timeout=10)
        self.batches.append(list(items))
        if any(item < 0 for item in items):
            raise ValueError("negative item")
        return [2 * item for item in items]


@pytest.fixture()
def executor():
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


def on_thread(run: Doubler, executor: ThreadPoolExecutor, **options) -> Coalescer[int, int]:
    """A coalescer whose batches run on ``executor`` (as the memory store's do)."""
    return Coalescer(lambda items: asyncio.get_running_loop().run_in_executor(executor, run, items),
                     name="doubler", **options)


async def test_concurrent_items_share_batches_and_get_their_own_results(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    coalescer = on_thread(run, executor, max_batch=8)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(20)))
    assert results == [2 * i for i in range(20)]
    assert sorted(item for batch in run.batches for item in batch) == list(range(20))
    assert max(len(batch) for batch in run.batches) == 8  # capped, and batching happened
    assert len(run.batches) == coalescer.num_batches == 3


async def test_items_arriving_while_a_batch_runs_go_into_the_next(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    run.release.clear()
    coalescer = on_thread(run, executor, max_batch=64)
    first = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0.05)  # the first batch is running (blocked in the worker)
    later = [asyncio.ensure_future(coalescer.submit(i)) for i in range(2, 6)]
    await asyncio.sleep(0.05)
    run.release.set()
    assert await first == 2 and await asyncio.gather(*later) == [4, 6, 8, 10]
    assert run.batches == [[1], [2, 3, 4, 5]]


async def test_a_bad_item_fails_only_its_caller(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    coalescer = on_thread(run, executor, max_batch=8)
    results = await asyncio.gather(*(coalescer.submit(i) for i in (1, -1, 3)), return_exceptions=True)
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], ValueError)
    assert await coalescer.submit(4) == 8  # still serving


async def test_a_cancelled_caller_is_dropped_before_its_batch_runs(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    run.release.clear()
    coalescer = on_thread(run, executor, max_batch=64)
    first = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0.05)
    doomed, survivor = asyncio.ensure_future(coalescer.submit(7)), asyncio.ensure_future(coalescer.submit(8))
    await asyncio.sleep(0)
    doomed.cancel()
    run.release.set()
    assert await first == 2 and await survivor == 16
    assert doomed.cancelled() and run.batches == [[1], [8]]


async def test_a_wait_window_gathers_callers_that_arrive_within_it(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    coalescer = on_thread(run, executor, max_batch=64, wait_s=0.2)
    first = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0.02)  # later than the first's loop turn, inside its window
    assert await asyncio.gather(first, coalescer.submit(2)) == [2, 4]
    assert run.batches == [[1, 2]]


async def test_batches_are_bounded_by_the_items_sizes(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    coalescer = on_thread(run, executor, max_batch=5, size=lambda item: item)
    assert await asyncio.gather(*(coalescer.submit(i) for i in (3, 2, 4, 9))) == [6, 4, 8, 18]
    assert run.batches == [[3, 2], [4], [9]]  # an item over the bound still runs, alone


async def test_close_fails_waiting_callers_and_later_ones_start_anew(executor: ThreadPoolExecutor) -> None:
    run = Doubler()
    run.release.clear()
    coalescer = on_thread(run, executor, max_batch=64)
    running = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0.05)
    waiting = asyncio.ensure_future(coalescer.submit(2))
    await asyncio.sleep(0)
    coalescer.close()
    run.release.set()
    for caller in (running, waiting):
        with pytest.raises(RuntimeError, match="doubler"):
            await caller


def test_one_coalescer_serves_event_loops_one_after_another(executor: ThreadPoolExecutor) -> None:
    """An owner that outlives a loop (a searcher in a test fixture) must not wait on the old loop's task."""
    run = Doubler()
    coalescer = on_thread(run, executor, max_batch=8)
    assert asyncio.run(coalescer.submit(1)) == 2
    assert asyncio.run(coalescer.submit(2)) == 4
