"""How cost grows: questions/s and p50/p99 latency of the research loop against concurrency (1, 8, 32,
128 questions in flight) and against the size of the workflow memory (0, 10k, 100k entries).

    python bench/bench_scaling.py --out bench/results/scaling.json --plot bench/results/scaling.png

The loop runs in this process on ``Services`` (the serving path without its HTTP front), G = 1 unless
``--rollouts`` says otherwise. Memory sizes are reached by importing synthetic entries (random unit
embeddings, short texts: the store, its FAISS index and the fused scoring run as with real ones; only
the encoder is skipped, which is the same cost at any size). Each concurrency level answers
``max(level, --min-questions)`` questions. Memory levels run at ``--memory-concurrency``, one store per
size, in ``--memory-rounds`` rounds whose order alternates (the ratio is the median of the rounds').
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

from bench.results_io import Result  # noqa: E402
from bench.stats import metrics_breakdown, percentile, report  # noqa: E402
from mia_engine.agent.loop import ResearchRequest  # noqa: E402
from mia_engine.cli import dotted_overrides  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.memory.entries import MemoryEntry, vector_to_bytes  # noqa: E402
from mia_engine.memory.service import MemoryService  # noqa: E402
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


async def fill_memory(memory: MemoryService, target: int, seed: int) -> int:
    """Import synthetic entries until the store holds ``target`` (in chunks, so journal records stay small)."""
    stats = await memory.stats()
    have = stats.num_entries
    dim = stats.dim
    categories = list(memory.config.categories)
    chunk = 5000
    while have < target:
        num = min(chunk, target - have)
        have += await memory.import_records(synthetic_entries(num, dim, categories, seed + have))
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

    before, stages_before = _tokens(services), metrics_breakdown(services.metrics.registry)["stage_seconds"]
    start = time.perf_counter()
    await asyncio.gather(*(one(q) for q in questions))
    wall = time.perf_counter() - start
    prompt, generated = (after - b for after, b in zip(_tokens(services), before))
    stages = metrics_breakdown(services.metrics.registry)["stage_seconds"]
    return {"questions": len(questions), "questions_per_s": len(questions) / wall, "p50_s": statistics.median(latencies),
            "p99_s": percentile(latencies, 0.99), "wall_s": wall,
            "prompt_tokens_per_question": prompt / len(questions),
            "generated_tokens_per_question": generated / len(questions),
            "stage_s_per_question": {stage: (seconds - stages_before.get(stage, 0.0)) / len(questions)
                                     for stage, seconds in sorted(stages.items())}}


def _tokens(services: Services) -> tuple[float, float]:
    """Prompt and generated tokens so far, all roles (the work a level asked of the engine: the tiny
    model's output, and so its turns, change with its prompt)."""
    breakdown = metrics_breakdown(services.metrics.registry)
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
        warm_up = max(4, args.memory_concurrency)  # the encoder and the engine see batch shapes like the levels'
        await run_level(services, questions_for(warm_up, 10**6), warm_up, args.rollouts)
        offset = 0
        for level in args.concurrency:
            questions = questions_for(max(level, args.min_questions), offset)
            offset += len(questions)
            result["concurrency"][level] = await run_level(services, questions, level, args.rollouts)
            print(f"concurrency {level}: {result['concurrency'][level]}", flush=True)
        result["memories"], result["memory_ratios"] = await memory_levels(services, tmp, args, offset)
    finally:
        await services.stop()
    conc = result["concurrency"]
    if 32 in conc and 128 in conc:
        result["ratio_128_vs_32"] = conc[128]["questions_per_s"] / conc[32]["questions_per_s"]
    if result["memory_ratios"]:
        result["ratio_largest_vs_empty_memory"] = statistics.median(result["memory_ratios"])
    return result


async def memory_levels(services: Services, tmp: Path, args: argparse.Namespace,
                        offset: int) -> tuple[dict[int, dict], list[float]]:
    """One store per size (all sharing the server's encoder), filled first; then rounds in which the
    agent answers ``--min-questions`` new questions against each store in turn, the order reversed
    every round. Per size: the median of its rounds; and per round the largest/smallest ratio."""
    sizes = sorted(args.memories)
    stores = {}
    for size in sizes:
        stores[size] = await MemoryService.open(tmp / f"memory-{size}", services.config.memory,
                                                encoder=services.encoders[0])
        await fill_memory(stores[size], size, args.seed)
    agent = services.agent.agent
    served = agent.memory
    rows: dict[int, list[dict]] = {size: [] for size in sizes}
    ratios = []
    try:
        for r in range(args.memory_rounds):
            for size in sizes if r % 2 == 0 else reversed(sizes):
                agent.memory = stores[size]
                questions = questions_for(args.min_questions, offset)
                offset += len(questions)
                rows[size].append({**await run_level(services, questions, args.memory_concurrency, args.rollouts),
                                   "stored": (await stores[size].stats()).num_entries})
                print(f"round {r}, memories {size}: {rows[size][-1]}", flush=True)
            if len(sizes) > 1:
                ratios.append(rows[sizes[-1]][-1]["questions_per_s"] / rows[sizes[0]][-1]["questions_per_s"])
    finally:
        agent.memory = served
        for store in stores.values():
            await store.close()
    return {size: {**_median_row(runs), "rounds": runs} for size, runs in rows.items()}, ratios


def _median_row(runs: list[dict]) -> dict:
    """Per numeric field the median over rounds (stage times included)."""
    row = {key: statistics.median(run[key] for run in runs) for key, value in runs[0].items()
           if isinstance(value, (int, float))}
    row["stage_s_per_question"] = {stage: statistics.median(run["stage_s_per_question"].get(stage, 0.0) for run in runs)
                                   for stage in runs[0]["stage_s_per_question"]}
    return row


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
    parser.add_argument("--memory-rounds", type=int, default=3, help="rounds over the memory sizes, order alternating")
    parser.add_argument("--rollouts", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="--KEY=VALUE", help="config override")
    args = parser.parse_args()
    record = Result("scaling")
    result = asyncio.run(main_async(args))
    if args.plot is not None:
        plot(result, args.plot)
    for level, row in result["concurrency"].items():  # one run per level
        record.add_run(kind="concurrency", in_flight=str(level), **row)
    for size, row in result["memories"].items():  # and per memory size, one per round
        for round_index, run in enumerate(row["rounds"]):
            record.add_run(kind="memories", stored_memories=str(size), round=round_index, **run)
    for round_index, ratio in enumerate(result.get("memory_ratios") or []):
        record.add_run(kind="memory_ratio", round=round_index, largest_over_empty=ratio)
    report(result, args.out, result=record, args=args)


if __name__ == "__main__":
    main()
