"""Retrieval of workflow memories: a query (``SearchQuery``) and the batched search that answers several,
one score-kernel call per bucket."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple

import numpy as np

from ..config.memory import MemoryConfig
from .buckets import ScoredRow, ScoreFn
from .contents import StoreContents
from .entries import BucketKey, SearchResult


class SearchQuery(NamedTuple):
    """One retrieval: embedded question (and caption) keys, the bucket, how many of each label."""

    query_q: np.ndarray
    query_c: np.ndarray | None
    bucket: BucketKey
    num_positive: int
    num_negative: int


Ranked = tuple[list[ScoredRow], list[ScoredRow]]
"""One query's positives and negatives, best first."""
BlasCap = Callable[[], AbstractContextManager]
"""``blas.blas_thread_cap``'s context factory."""


def search_many(contents: StoreContents, queries: Sequence[SearchQuery], config: MemoryConfig, score_fn: ScoreFn,
                blas_cap: BlasCap) -> list[SearchResult]:
    """Top positives and negatives of each query's bucket by the paper's score, with its terms (results in
    the queries' order); hits below ``min_similarity`` are left out."""
    results: list[SearchResult | None] = [None] * len(queries)
    by_bucket: dict[BucketKey, list[int]] = {}
    for i, query in enumerate(queries):
        by_bucket.setdefault(query.bucket, []).append(i)
    floor = config.min_similarity
    for bucket, members in by_bucket.items():
        ranked = _ranked(contents, bucket, [queries[i] for i in members], config, score_fn, blas_cap)
        for i, (positives, negatives) in zip(members, ranked):
            query = queries[i]
            results[i] = SearchResult(
                str(bucket),
                contents.hits([row for row in positives[:query.num_positive] if row.sim >= floor]),
                contents.hits([row for row in negatives[:query.num_negative] if row.sim >= floor]))
    return [result for result in results if result is not None]


def _ranked(contents: StoreContents, bucket: BucketKey, queries: list[SearchQuery], config: MemoryConfig,
            score_fn: ScoreFn, blas_cap: BlasCap) -> list[Ranked]:
    """The ranked rows of one bucket for each of ``queries`` (all of that bucket), one kernel call."""
    found = contents.buckets.get(bucket)
    k = max(max(query.num_positive, query.num_negative) for query in queries)
    if found is None or k <= 0:
        return [([], [])] * len(queries)
    with blas_cap():
        return found.top_k(np.stack([query.query_q for query in queries]), [query.query_c for query in queries],
                           k, config.score, score_fn, config.score_backend)
