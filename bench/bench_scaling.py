"""How cost grows: questions/s and p50/p99 latency of the research loop against concurrency (1, 8, 32,
128 questions in flight) and against the size of the workflow memory (0, 10k, 100k entries).

    python bench/bench_scaling.py --out bench/results/scaling.json --plot bench/results/scaling.png

The loop runs in this process on ``Services`` (the serving path without its HTTP front), G = 1 unless
``--rollouts`` says otherwise. Memory sizes are reached by importing synthetic entries (random unit
embeddings, short texts: the store, its FAISS index and the fused scoring run as with real ones; only
the encoder is skipped, which is the same cost at any size). Each concurrency level answers
``max(level, --min-questions)`` questions; memory levels run at ``--memory-concurrency``.
Goals (issue 15): no cliff: throughput at 100k memories >= 0.9x empty; 128 in flight >= 32 in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import percentile, report  # noqa: E402
from mia_engine.agent.loop import ResearchRequest  # noqa: E402
from mia_engine.cli import dotted_overrides  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.memory.entries import MemoryEntry, vector_to_bytes  # noqa: E402
from mia_engine.services import Services  # noqa: E402


def synthetic_entries(num: int, dim: int, categories: list[str], seed: int) -> list[MemoryEntry]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((num, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    now = time.time()
    return [MemoryEntry(uuid.uuid4().hex, "text", categories[i % len(categories)], f"synthetic question {i}",
                        f"1. **search** (synthetic {i} -> result)", "correct" if i % 3 else "incorrect",
                        num_uses=int(rng.integers(0, 5)), created_at=now, updated_at=now,
                        question_embedding=vector_to_bytes(vectors[i]))
            for i in range(num)]


async def fill_memory(services: Services, target: int, seed: int) -> int:
    """Import synthetic entries until the store holds ``target`` (in chunks, so journal records stay small)."""
    stats = await services.memory.stats()
    have = stats.num_entries
    dim = stats.dim
    categories = list(services.config.memory.categories)
    chunk = 5000
    while have < target:
        num = min(chunk, target - have)
        have += await services.memory.import_records(synthetic_entries(num, dim, categories, seed + have))
    return have


async def run_level(services: Services, questions: list[str], concurrency: int, rollouts: int) -> dict[str, float]:
    agent = services.agent.agent
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(q: str) -> None:
        async with gate:
            start = time.perf_counter()
            await agent.research(ResearchRequest(q, None, rollouts, False))
            latencies.append(time.perf_counter() - start)

    before = _tokens(services)
    start = time.perf_counter()
    await asyncio.gather(*(one(q) for q in questions))
    wall = time.perf_counter() - start
    prompt, generated = (after - b for after, b in zip(_tokens(services), before))
    return {"questions": len(questions), "questions_per_s": len(questions) / wall, "p50_s": statistics.median(latencies),
            "p99_s": percentile(latencies, 0.99), "wall_s": wall,
            "prompt_tokens_per_question": prompt / len(questions),
            "generated_tokens_per_question": generated / len(questions)}


def _tokens(services: Services) -> tuple[float, float]:
    """Prompt and generated tokens so far, all roles (the work a level asked of the engine: the tiny
    model's output, and so its turns, change with its prompt)."""
    breakdown = services.metrics.breakdown()
    return sum(breakdown["prompt_tokens"].values()), sum(breakdown["completion_tokens"].values())


def questions_for(n: int, offset: int) -> list[str]:
    return [f"Question {offset + i}: which river flows through the capital city number {offset + i}?"
            for i in range(n)]


async def main_async(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mia-scaling-bench-"))
    config = load_config(args.config, {"data_dir": str(tmp), "memory.max_num_stored": max(args.memories) + 1000,
                                       **dotted_overrides(args.set)})
    services = Services(config)
    await services.start()
    result: dict = {"concurrency": {}, "memories": {}}
    try:
        await run_level(services, questions_for(4, 10**6), 4, args.rollouts)  # warm-up
        offset = 0
        for level in args.concurrency:
            questions = questions_for(max(level, args.min_questions), offset)
            offset += len(questions)
            result["concurrency"][level] = await run_level(services, questions, level, args.rollouts)
            print(f"concurrency {level}: {result['concurrency'][level]}", flush=True)
        for size in sorted(args.memories):
            stored = await fill_memory(services, size, args.seed)
            questions = questions_for(args.min_questions, offset)
            offset += len(questions)
            row = await run_level(services, questions, args.memory_concurrency, args.rollouts)
            result["memories"][size] = {**row, "stored": stored}
            print(f"memories {stored}: {row}", flush=True)
    finally:
        await services.stop()
    conc, mem = result["concurrency"], result["memories"]
    if 32 in conc and 128 in conc:
        result["ratio_128_vs_32"] = conc[128]["questions_per_s"] / conc[32]["questions_per_s"]
    sizes = sorted(mem)
    if len(sizes) > 1:
        result["ratio_largest_vs_empty_memory"] = mem[sizes[-1]]["questions_per_s"] / mem[sizes[0]]["questions_per_s"]
    return result


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, xlabel in ((left, "concurrency", "questions in flight"), (right, "memories", "stored memories")):
        xs = sorted(result[key])
        ax.plot(xs, [result[key][x]["questions_per_s"] for x in xs], "o-", label="questions/s")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("questions/s")
        twin = ax.twinx()
        twin.plot(xs, [result[key][x]["p50_s"] for x in xs], "s--", color="tab:orange", label="p50 s")
        twin.plot(xs, [result[key][x]["p99_s"] for x in xs], "^--", color="tab:red", label="p99 s")
        twin.set_ylabel("latency (s)")
        ax.set_xscale("symlog")
        ax.legend(loc="upper left")
        twin.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--memories", type=int, nargs="+", default=[0, 10_000, 100_000])
    parser.add_argument("--min-questions", type=int, default=32, help="questions per level at least")
    parser.add_argument("--memory-concurrency", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="--KEY=VALUE", help="config override")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.plot is not None:
        plot(result, args.plot)
    report(result, args.out, args={k: str(v) for k, v in vars(args).items()})


if __name__ == "__main__":
    main()
