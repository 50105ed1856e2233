"""The memory's score + top-k per label (paper appendix 10) on one CPU bucket: the fast ``cpu`` path
against the torch reference, 10k and 100k entries of d = 384, one query, k = 4 (the kernels' own tests
check they agree)."""

from __future__ import annotations

import pytest
import torch

from bench.bench_memory_score import WEIGHTS, Bucket, make_bucket
from mia_kernels.memory_score import memory_topk


@pytest.fixture(scope="module", params=[10_000, 100_000], ids=lambda n: f"N{n}")
def bucket(request: pytest.FixtureRequest) -> Bucket:
    return make_bucket(request.param, 384, 1, has_captions=False)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_memory_score(benchmark, bucket: Bucket, backend: str) -> None:  # noqa: ANN001
    torch.set_num_threads(1)  # memory.score_cpu_threads' default: the figure does not follow the machine's cores
    result = benchmark(lambda: memory_topk(**bucket.kwargs(), k=4, weights=WEIGHTS, backend=backend))
    assert result.ids.shape == (1, 2, 4)
