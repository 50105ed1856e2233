"""A cap on numpy's BLAS threads while the store scores on CPU (``memory.score_cpu_threads``).

The CPU score path streams a bucket's keys through OpenBLAS, whose threads keep spinning for a while
after each product. In a serving process the engine already holds every core, so those spinning
threads took time from the model: with a large store the research loop ran slower with OpenBLAS's
default threads than with one. The cap applies per call and is restored after it, and only OpenBLAS is touched: torch's
MKL/OpenMP pools (the engine, the encoder, the learner) keep their own settings.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial


def blas_thread_cap(limit: int) -> Callable[[], AbstractContextManager]:
    """A context factory: inside it OpenBLAS uses at most ``limit`` threads; 0 = no cap."""
    if limit <= 0:
        return nullcontext
    from threadpoolctl import ThreadpoolController  # numpy is imported, so its OpenBLAS is loaded

    openblas = ThreadpoolController().select(internal_api="openblas")
    return partial(openblas.limit, limits=limit)
