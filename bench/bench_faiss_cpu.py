"""Latency of one exact FAISS search on the CPU, built as ``mia_engine/memory/index.py`` builds it
(``IndexIDMap2`` over ``IndexFlatIP``): what a nearest-neighbour lookup of the memory store costs when
``memory.index_device = "cpu"`` (duplicate replacement, Meta Plan retrieval).

    python bench/bench_faiss_cpu.py --entries 100000 --dim 384 --k 8 --threads 0 1

Random unit vectors (an exact flat search reads every vector whatever they hold). For each thread count
(0 = FAISS's default, one per core) it times ``--repeats`` single-query searches after ``--warmup``
ones and prints the median and p90 in milliseconds, one JSON line per thread count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import faiss
import numpy as np


def build_index(num_entries: int, dim: int, seed: int) -> tuple[faiss.IndexIDMap2, np.ndarray]:
    """The index over ``num_entries`` random unit vectors of ``dim`` floats, and the vectors (n, d)."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((num_entries, dim), dtype=np.float32)  # (n, d)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    index.add_with_ids(vectors, np.arange(num_entries, dtype=np.int64))
    return index, vectors


def time_searches(index: faiss.IndexIDMap2, queries: np.ndarray, k: int, num_warmup: int) -> list[float]:
    """Seconds of each single-query search of ``queries`` (q, d), after ``num_warmup`` untimed ones."""
    for row in queries[:num_warmup]:
        index.search(row[None, :], k)
    seconds = []
    for row in queries[num_warmup:]:
        start = time.perf_counter()
        index.search(row[None, :], k)  # (1, k) scores and ids
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000, help="vectors in the index")
    parser.add_argument("--dim", type=int, default=384, help="vector width (the sentence encoder's)")
    parser.add_argument("--k", type=int, default=8, help="neighbours per search")
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 1], help="OpenMP threads; 0 = default")
    parser.add_argument("--repeats", type=int, default=200, help="timed searches per thread count")
    parser.add_argument("--warmup", type=int, default=20, help="untimed searches first")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    index, vectors = build_index(args.entries, args.dim, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    default_threads = faiss.omp_get_max_threads()
    for num_threads in args.threads:
        faiss.omp_set_num_threads(num_threads or default_threads)
        picks = rng.integers(0, args.entries, args.warmup + args.repeats)
        seconds = time_searches(index, vectors[picks], args.k, args.warmup)
        print(json.dumps({"entries": args.entries, "dim": args.dim, "k": args.k,
                          "threads": faiss.omp_get_max_threads(), "repeats": args.repeats,
                          "median_ms": round(statistics.median(seconds) * 1e3, 3),
                          "p90_ms": round(statistics.quantiles(seconds, n=10)[-1] * 1e3, 3),
                          "faiss": faiss.__version__}))


if __name__ == "__main__":
    main()
