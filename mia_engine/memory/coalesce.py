"""Coalescing calls to a single-threaded worker: what arrives while a batch runs goes into the next one.

The memory store runs on one thread, so concurrent searches queue behind each other anyway; handing
the queue over as one batch costs no waiting (nothing is held back for a timer) and lets one kernel
call serve all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

I = TypeVar("I")
O = TypeVar("O")


class Coalescer(Generic[I, O]):
    """``await submit(item)`` → ``run([..., item, ...])[i]``, with ``run`` on ``executor``.

    A failing batch is retried item by item, so one bad item fails only its own caller. A caller
    that goes away (cancelled) is dropped from the batch that has not started yet.
    """

    def __init__(self, run: Callable[[Sequence[I]], Sequence[O]], executor: Executor, max_batch: int) -> None:
        self._run = run
        self._executor = executor
        self._max_batch = max_batch
        self._pending: list[tuple[I, asyncio.Future[O]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.num_batches = 0
        """Calls to ``run`` so far (tests and benchmarks read it)."""

    async def submit(self, item: I) -> O:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[O] = loop.create_future()
        self._pending.append((item, future))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[I, asyncio.Future[O]]] = []
        try:
            while self._pending:
                batch = [pair for pair in self._pending[: self._max_batch] if not pair[1].done()]
                del self._pending[: self._max_batch]
                if batch:
                    await self._run_batch(batch)
                batch = []
        except BaseException as err:  # cancelled with the loop: nobody may wait forever
            for _, future in (*batch, *self._pending):
                if not future.done():
                    future.set_exception(RuntimeError("the memory store's search worker stopped") if
                                         isinstance(err, asyncio.CancelledError) else err)
            self._pending.clear()
            raise
        finally:
            self._drainer = None

    async def _run_batch(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._executor, self._run, [item for item, _ in batch])
            self.num_batches += 1
        except Exception as err:
            if len(batch) == 1:
                _settle(batch[0][1], error=err)
                return
            for pair in batch:  # find the bad item: each alone
                await self._run_batch([pair])
            return
        for (_, future), output in zip(batch, outputs):
            _settle(future, output)


def _settle(future: asyncio.Future, output: object = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(output)
