"""Coalescing concurrent calls into batches: what arrives while a batch runs (or within a short wait
window) goes into the next one.

Two workers need it: the memory store, which runs on one thread, so concurrent searches queue behind
each other anyway and one kernel call can score all of them; and local passage search, where the G
rollouts of every question in flight share one encoder forward and one FAISS search. One owner keeps
the rules they share: a failing batch is retried item by item (one bad item fails only its caller), a
caller that went away is dropped before its batch runs, and nobody waits forever when the worker
stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")
O = TypeVar("O")


class Coalescer(Generic[I, O]):
    """``await submit(item)`` → ``(await run([..., item, ...]))[i]``.

    ``max_batch`` bounds a batch by the sum of ``size(item)`` (an item larger than it still runs,
    alone); ``wait_s`` is how long a batch waits for company after its first item (0: only what
    arrived in the same event-loop turn, or while the previous batch ran). One drainer task per event
    loop (a long-lived owner may outlive a test's loop).
    """

    def __init__(self, run: Callable[[list[I]], Awaitable[Sequence[O]]], *, max_batch: int, name: str,
                 wait_s: float = 0.0, size: Callable[[I], int] | None = None) -> None:
        if max_batch < 1 or wait_s < 0:
            raise ValueError("max_batch must be >= 1 and wait_s >= 0")
        self._run = run
        self._max_batch = max_batch
        self._name = name
        self._wait_s = wait_s
        self._size = size or (lambda _: 1)
        self._pending: list[tuple[I, asyncio.Future[O]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.num_batches = 0
        """Successful calls to ``run`` so far (tests and benchmarks read it)."""

    async def submit(self, item: I) -> O:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[O] = loop.create_future()
        self._pending.append((item, future))
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain(), name=f"{self._name}-batcher")
        return await future

    def close(self) -> None:
        """Stop draining; callers still waiting get an error."""
        drainer, self._drainer = self._drainer, None
        if drainer is not None and not drainer.done() and not drainer.get_loop().is_closed():
            drainer.cancel()
        _fail(self._pending, RuntimeError(f"{self._name} is closed"))
        self._pending.clear()

    async def _drain(self) -> None:
        batch: list[tuple[I, asyncio.Future[O]]] = []
        try:
            while self._pending:
                await asyncio.sleep(self._wait_s)  # 0: let callers already scheduled in this turn enqueue
                batch = self._take_batch()
                if batch:
                    await self._run_batch(batch)
                batch = []
        except BaseException as err:  # cancelled with the loop: nobody may wait forever
            _fail([*batch, *self._pending], RuntimeError(f"{self._name} stopped")
                  if isinstance(err, asyncio.CancelledError) else err)
            self._pending.clear()
            raise

    def _take_batch(self) -> list[tuple[I, asyncio.Future[O]]]:
        batch, total = [], 0
        while self._pending and (not batch or total + self._size(self._pending[0][0]) <= self._max_batch):
            item, future = self._pending.pop(0)
            if not future.done():  # a cancelled caller costs nothing
                batch.append((item, future))
                total += self._size(item)
        return batch

    async def _run_batch(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        try:
            outputs = await self._run([item for item, _ in batch])
            self.num_batches += 1
        except Exception as err:
            if len(batch) == 1:
                _fail(batch, err)
                return
            for pair in batch:  # find the bad item: each alone
                if not pair[1].done():
                    await self._run_batch([pair])
            return
        for (_, future), output in zip(batch, outputs):
            if not future.done():
                future.set_result(output)


def _fail(pairs: Sequence[tuple[object, asyncio.Future]], error: BaseException) -> None:
    for _, future in pairs:
        if not future.done():
            future.set_exception(error)
