"""Concurrent memory searches through ``MemoryService``: coalesced into one kernel call per batch
(``memory.search_batch_size``, the default) against one kernel call per search (``= 1``).

    python bench/bench_memory_search.py --entries 100000 --concurrency 32 --rounds 6 \\
        --out bench/results/memory_search_batching.json

Two services share one encoder and hold the same synthetic entries (``bench_scaling``'s: random unit
embeddings, so every search scores the whole bucket as with real ones). Each round sends
``--concurrency`` searches at once to one service, then the same questions to the other; the order
alternates round by round, and the ratio is taken per round (searches/s batched over unbatched).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_scaling import synthetic_entries  # noqa: E402
from bench.results_io import Result  # noqa: E402
from bench.stats import percentile, report  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.memory.embedder import Embedder  # noqa: E402
from mia_engine.memory.service import MemoryService  # noqa: E402


async def one_round(service: MemoryService, questions: list[str]) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def one(question: str) -> None:
        start = time.perf_counter()
        await service.search(question)
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(one(q) for q in questions))
    return len(questions) / (time.perf_counter() - start), latencies


async def main_async(args: argparse.Namespace, result: Result) -> dict:
    memory = load_config(args.config).memory
    memory = msgspec.structs.replace(memory, max_num_stored=args.entries + 1000)
    encoder = Embedder(memory.embedder)
    root = Path(tempfile.mkdtemp(prefix="mia-search-bench-"))
    services = {}
    for name, size in (("batched", memory.search_batch_size), ("one_by_one", 1)):
        config = msgspec.structs.replace(memory, search_batch_size=size)
        services[name] = await MemoryService.open(root / name, config, encoder=encoder)
        have = 0
        while have < args.entries:  # the same entries in both (same seeds)
            have += await services[name].import_records(
                synthetic_entries(min(5000, args.entries - have), encoder.dim, list(memory.categories), have))
    rates: dict[str, list[float]] = {name: [] for name in services}
    latencies: dict[str, list[float]] = {name: [] for name in services}
    ratios = []
    try:
        for name in services:  # warm-up
            await one_round(services[name], [f"warm-up {i}" for i in range(args.concurrency)])
        for r in range(args.rounds):
            questions = [f"Question {r}-{i}: which river flows through capital city {i}?" for i in range(args.concurrency)]
            order = list(services) if r % 2 == 0 else list(reversed(services))
            for name in order:
                rate, lat = await one_round(services[name], questions)
                rates[name].append(rate)
                latencies[name] += lat
            ratios.append(rates["batched"][-1] / rates["one_by_one"][-1])
            result.add_run(round=r, batched_searches_per_s=rates["batched"][-1],
                           one_by_one_searches_per_s=rates["one_by_one"][-1], ratio=ratios[-1])
            print(f"round {r}: batched {rates['batched'][-1]:.1f}/s, one by one {rates['one_by_one'][-1]:.1f}/s",
                  flush=True)
    finally:
        for service in services.values():
            await service.close()
        encoder.close()
    return {
        "entries": args.entries, "concurrency": args.concurrency, "rounds": args.rounds,
        **{f"{name}_searches_per_s": statistics.median(rates[name]) for name in services},
        **{f"{name}_p50_ms": 1000 * statistics.median(latencies[name]) for name in services},
        **{f"{name}_p99_ms": 1000 * percentile(latencies[name], 0.99) for name in services},
        "ratio_median": statistics.median(ratios), "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = Result("memory_search")
    report(asyncio.run(main_async(args, result)), args.out, result=result, args=args)


if __name__ == "__main__":
    main()
