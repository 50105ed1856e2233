"""Local passage search, micro-batched across every concurrent trajectory.

The reference sends one HTTP request per query to a separate retrieval server. Here the G
rollouts of every question in flight share one searcher: queries that arrive within
``batch_wait_ms`` of each other (or while a batch is running) go through ONE encoder forward and
ONE FAISS search, which runs in a thread so the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .calls import truncate_words
from .config import ToolsConfig
from .corpus import BuildProgress, Passage, build_index, load_corpus, load_index

RESULT_SEPARATOR = "\n=======\n"
"""Between the results of several queries of one call (reference format)."""


class QueryEncoder(Protocol):
    """What local search needs from the sentence encoder: batch encoding to unit vectors, off the event
    loop (``memory.embedder.Embedder`` has it; tools declare what they use rather than import memory)."""

    @property
    def dim(self) -> int: ...

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray: ...


class _Request:
    __slots__ = ("queries", "top_k", "future")

    def __init__(self, queries: list[str], top_k: int, future: asyncio.Future) -> None:
        self.queries, self.top_k, self.future = queries, top_k, future


class LocalSearch:
    """FAISS flat inner-product search over a built index, shared by all concurrent callers."""

    def __init__(self, index_dir: str | Path, encoder: QueryEncoder, *, batch_wait_ms: float = 2.0,
                 max_batch_queries: int = 512, query_prefix: str = "") -> None:
        self._index, self.passages, self.meta = load_index(index_dir)
        if self.meta.dim != encoder.dim:
            raise ValueError(f"index {index_dir} has dim {self.meta.dim}, the encoder {encoder.dim}")
        self._encoder = encoder
        self._batch_wait_s = batch_wait_ms / 1000.0
        self._max_batch_queries = max_batch_queries
        self._query_prefix = query_prefix
        self._faiss_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="faiss-search")
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self.num_batches = 0
        """Micro-batches run so far (one encoder forward and one FAISS search each)."""

    @classmethod
    def from_config(cls, config: ToolsConfig, encoder: Any, index_root: str | Path,
                    progress: bool = True, tracker: BuildProgress | None = None) -> LocalSearch:
        """Load (building first if needed: blocking, minutes for large corpora) the configured index."""
        corpus = load_corpus(config.corpus, config.max_passages or None)
        folder = build_index(corpus, encoder, config.index_dir or index_root,
                             embedder_name=embedder_name(encoder), passage_prefix=config.passage_prefix,
                             batch_size=config.index_build_batch, progress=progress, tracker=tracker)
        return cls(folder, encoder, batch_wait_ms=config.batch_wait_ms,
                   max_batch_queries=config.max_batch_queries, query_prefix=config.query_prefix)

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Passage]]:
        """``top_k`` passages per query, best first; merged with other callers' queries."""
        if not queries:
            return []
        if top_k < 1:
            raise ValueError("top_k must be >= 1")
        loop = asyncio.get_running_loop()
        request = _Request([str(q) for q in queries], top_k, loop.create_future())
        self._ensure_worker(loop)
        self._pending.append(request)
        assert self._wake is not None
        self._wake.set()
        return await request.future

    def close(self) -> None:
        """Stop the batcher and the FAISS thread (pending callers get an error)."""
        if self._worker is not None:
            self._worker.cancel()
        self._fail(self._pending, RuntimeError("local search is closed"))
        self._pending = []
        self._faiss_thread.shutdown(wait=False)

    # ---- micro-batching --------------------------------------------------------------------

    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        """One batcher task per event loop (a searcher outlives a test's loop in fixtures)."""
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._serve(), name="local-search-batcher")

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            if self._batch_wait_s > 0:
                await asyncio.sleep(self._batch_wait_s)
            else:
                await asyncio.sleep(0)  # let callers already scheduled in this loop turn enqueue
            batch = self._take_batch()
            if not self._pending:
                self._wake.clear()
            if batch:
                await self._run(batch)

    def _take_batch(self) -> list[_Request]:
        batch, num_queries = [], 0
        while self._pending and (not batch or num_queries + len(self._pending[0].queries) <= self._max_batch_queries):
            request = self._pending.pop(0)
            if not request.future.done():  # a cancelled caller costs nothing
                batch.append(request)
                num_queries += len(request.queries)
        return batch

    async def _run(self, batch: list[_Request]) -> None:
        # G rollouts of one question often issue the same query: encode and search each text once
        unique = list(dict.fromkeys(self._query_prefix + q for request in batch for q in request.queries))
        top_k = min(max(request.top_k for request in batch), len(self.passages))
        try:
            vectors = await self._encoder.encode_async(unique)  # (U, d): one forward for the batch
            loop = asyncio.get_running_loop()
            ids = await loop.run_in_executor(self._faiss_thread, self._faiss_search, vectors, top_k)
        except Exception as err:  # every waiter of the batch gets the failure; the batcher lives on
            self._fail(batch, err)
            return
        self.num_batches += 1
        row_of = {text: row for text, row in zip(unique, ids)}
        for request in batch:
            if not request.future.done():
                rows = [row_of[self._query_prefix + query][: request.top_k] for query in request.queries]
                request.future.set_result([self._passages_of(row) for row in rows])

    def _faiss_search(self, vectors: np.ndarray, top_k: int) -> np.ndarray:
        _, ids = self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), top_k)
        return ids  # (Q, top_k), -1 where fewer passages exist

    def _passages_of(self, row: np.ndarray) -> list[Passage]:
        return [self.passages[i] for i in row.tolist() if i >= 0]

    @staticmethod
    def _fail(requests: list[_Request], err: BaseException) -> None:
        for request in requests:
            if not request.future.done():
                request.future.set_exception(err)


def embedder_name(encoder: Any) -> str:
    """Index-cache name of an encoder: its folder's last two path parts (``<package>-model``), its dtype
    and its token cap, each of which changes the vectors."""
    parts = Path(encoder.model_dir).expanduser().resolve().parts[-2:]
    name = "-".join(parts) + f"-{encoder.dtype}-t{encoder.max_seq_tokens}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def render_results(queries: Sequence[str], results: Sequence[Sequence[Passage]], max_words: int) -> str:
    """The reference (Search-R1) format: ``Doc i(Title: …) text`` lines per query, queries joined
    by ``=======``, the whole cut to ``max_words`` words."""
    blocks = []
    for query, passages in zip(queries, results):
        lines = [f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, 1)]
        blocks.append("\n".join(lines) if lines else f"No results found for {query!r}.")
    return truncate_words(RESULT_SEPARATOR.join(blocks), max_words)
