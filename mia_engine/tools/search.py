"""Local passage search, micro-batched across every concurrent trajectory.

The reference sends one HTTP request per query to a separate retrieval server. Here the G
rollouts of every question in flight share one searcher: queries that arrive within
``batch_wait_ms`` of each other (or while a batch is running) go through ONE encoder forward and
ONE FAISS search, which runs in a thread so the event loop never waits on it. A batch that fails is
retried caller by caller (``coalesce.Coalescer``), so a bad request fails only itself.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..base.coalesce import Coalescer
from .calls import truncate_words
from ..config.tools import ToolsConfig
from .corpus import BuildProgress, Passage, build_index, load_corpus, load_index

RESULT_SEPARATOR = "\n=======\n"
"""Between the results of several queries of one call (reference format)."""


class QueryEncoder(Protocol):
    """What local search needs from the sentence encoder: batch encoding to unit vectors, off the event
    loop (``memory.embedder.Embedder`` has it; tools declare what they use rather than import memory)."""

    @property
    def dim(self) -> int: ...

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray: ...


_Request = tuple[list[str], int]
"""A caller's queries and its top-k."""


class LocalSearch:
    """FAISS flat inner-product search over a built index, shared by all concurrent callers."""

    def __init__(self, index_dir: str | Path, encoder: QueryEncoder, *, batch_wait_ms: float = 2.0,
                 max_batch_queries: int = 512, query_prefix: str = "") -> None:
        self._index, self.passages, self.meta = load_index(index_dir)
        if self.meta.dim != encoder.dim:
            raise ValueError(f"index {index_dir} has dim {self.meta.dim}, the encoder {encoder.dim}")
        self._encoder = encoder
        self._query_prefix = query_prefix
        self._faiss_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="faiss-search")
        self._batches: Coalescer[_Request, list[list[Passage]]] = Coalescer(
            self._run, max_batch=max_batch_queries, name="local search", wait_s=batch_wait_ms / 1000.0,
            size=lambda request: len(request[0]))

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

    @property
    def num_batches(self) -> int:
        """Micro-batches run so far (one encoder forward and one FAISS search each)."""
        return self._batches.num_batches

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Passage]]:
        """``top_k`` passages per query, best first; merged with other callers' queries."""
        if not queries:
            return []
        if top_k < 1:
            raise ValueError("top_k must be >= 1")
        return await self._batches.submit(([str(q) for q in queries], top_k))

    def close(self) -> None:
        """Stop the batcher and the FAISS thread (pending callers get an error)."""
        self._batches.close()
        self._faiss_thread.shutdown(wait=False)

    async def _run(self, batch: list[_Request]) -> list[list[list[Passage]]]:
        """One encoder forward and one FAISS search for every query of the batch."""
        # G rollouts of one question often issue the same query: encode and search each text once
        unique = list(dict.fromkeys(self._query_prefix + q for queries, _ in batch for q in queries))
        top_k = min(max(k for _, k in batch), len(self.passages))
        vectors = await self._encoder.encode_async(unique)  # (U, d): one forward for the batch
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(self._faiss_thread, self._faiss_search, vectors, top_k)
        row_of = {text: row for text, row in zip(unique, ids)}
        return [[self._passages_of(row_of[self._query_prefix + query][:k]) for query in queries]
                for queries, k in batch]

    def _faiss_search(self, vectors: np.ndarray, top_k: int) -> np.ndarray:
        _, ids = self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), top_k)
        return ids  # (Q, top_k), -1 where fewer passages exist

    def _passages_of(self, row: np.ndarray) -> list[Passage]:
        return [self.passages[i] for i in row.tolist() if i >= 0]


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
