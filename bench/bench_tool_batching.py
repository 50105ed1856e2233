"""Benchmark: local search micro-batched across concurrent callers vs one query at a time.

On the full wiki-offline index (10,033 passages, all-MiniLM-L6-v2, FAISS IndexFlatIP; built once
into ``--cache-dir`` and reused), times ``--num-queries`` searches (top-3) three ways:
  batched     all callers concurrent, ``batch_wait_ms`` > 0: one encoder forward + one FAISS search
              for the whole micro-batch (what G rollouts × many questions get in the loop)
  queued      all callers concurrent, ``batch_wait_ms`` = 0: merges only what is already queued
  one-by-one  sequential awaits of single-query calls with ``batch_wait_ms`` = 0 (the reference's
              one request per query, minus its HTTP hop)
and checks that every mode returns the same passages. Modes run interleaved, round after round,
so load from other processes hits them alike. Prints a markdown table.

Run:  python bench/bench_tool_batching.py [--cache-dir DIR] [--num-queries 64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mia_engine.memory.config import EmbedderConfig  # noqa: E402
from mia_engine.memory.embedder import Embedder  # noqa: E402
from mia_engine.tools.corpus import WIKI_OFFLINE, build_index, load_corpus  # noqa: E402
from mia_engine.tools.search import LocalSearch, embedder_name  # noqa: E402

TOP_K = 3


class CountingEncoder:
    """Counts ``encode_async`` calls: each is one forward pass of the encoder."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.num_forwards = inner, 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    async def encode_async(self, texts):
        self.num_forwards += 1
        return await self.inner.encode_async(texts)


def make_queries(titles: list[str], num_queries: int, seed: int = 0) -> list[str]:
    """Question-like queries about random passages (deterministic)."""
    rng = random.Random(seed)
    templates = ("What is {}?", "history of {}", "Who is associated with {}?", "{} facts")
    return [rng.choice(templates).format(title) for title in rng.sample(titles, num_queries)]


async def batched(search: LocalSearch, queries: list[str]) -> list[list[str]]:
    results = await asyncio.gather(*(search.search([q], TOP_K) for q in queries))
    return [[p.title for p in result[0]] for result in results]


async def one_by_one(search: LocalSearch, queries: list[str]) -> list[list[str]]:
    return [[p.title for p in (await search.search([q], TOP_K))[0]] for q in queries]


async def run_once(search: LocalSearch, encoder: CountingEncoder, run: Callable[..., Awaitable],
                   queries: list[str]) -> tuple[float, int, list[list[str]]]:
    """(seconds, encoder forwards, titles) of one run of one mode."""
    encoder.num_forwards = 0
    start = time.perf_counter()
    titles = await run(search, queries)
    return time.perf_counter() - start, encoder.num_forwards, titles


async def bench(args: argparse.Namespace) -> None:
    embedder = Embedder(EmbedderConfig(batch_wait_ms=0.0))
    corpus = load_corpus(WIKI_OFFLINE)
    start = time.perf_counter()
    folder = build_index(corpus, embedder, args.cache_dir, embedder_name=embedder_name(embedder.model_dir))
    build_s = time.perf_counter() - start
    queries = make_queries([p.title for p in corpus.passages], args.num_queries)
    encoder = CountingEncoder(embedder)
    modes = [("batched", args.batch_wait_ms, batched), ("queued", 0.0, batched), ("one-by-one", 0.0, one_by_one)]
    searches = [LocalSearch(folder, encoder, batch_wait_ms=wait_ms) for _, wait_ms, _ in modes]
    seconds: list[list[float]] = [[] for _ in modes]
    forwards, titles = [0] * len(modes), [[]] * len(modes)
    try:
        for round_index in range(args.repeats + 1):  # round 0 warms up; modes interleave so load spikes hit all
            for i, ((_, _, run), search) in enumerate(zip(modes, searches)):
                spent, forwards[i], titles[i] = await run_once(search, encoder, run, queries)
                if round_index:
                    seconds[i].append(spent)
    finally:
        for search in searches:
            search.close()
    batch_s, singles_s = encoder_floor(embedder, queries, args.repeats)
    embedder.close()
    rows = [(name, wait, forwards[i], seconds[i], titles[i] == titles[0]) for i, (name, wait, _) in enumerate(modes)]
    print_table(rows, len(queries), len(corpus.passages), build_s, folder)
    print(f"\nencoder alone (no search, medians): one {len(queries)}-query forward {batch_s * 1e3:.1f} ms, "
          f"{len(queries)} single-query forwards {singles_s * 1e3:.1f} ms -> merging saves at most "
          f"{singles_s / batch_s:.1f}x of the encoder time")


def encoder_floor(embedder: Embedder, queries: list[str], repeats: int) -> tuple[float, float]:
    """Median seconds of the encoder alone, interleaved: all queries in one forward vs one per query."""
    batch, singles = [], []
    for _ in range(repeats):
        batch.append(_seconds(lambda: embedder.encode(queries)))
        singles.append(_seconds(lambda: [embedder.encode([q]) for q in queries]))
    return statistics.median(batch), statistics.median(singles)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def print_table(rows, num_queries: int, num_passages: int, build_s: float, folder) -> None:
    """Medians over the rounds; the speed-up is the median of per-round ratios (same round, same load)."""
    baseline = rows[-1][3]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{num_queries} searches (top-{TOP_K}) on {num_passages} passages, {len(baseline)} interleaved rounds; "
          f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load}; index {folder.name} "
          f"(ready in {build_s:.1f} s)\n")
    print("| mode | batch_wait_ms | encoder forwards | wall ms (median) | ms / query | speed-up vs one-by-one "
          "(median, min-max) | same results |")
    print("|---|---|---|---|---|---|---|")
    for name, wait_ms, forwards, seconds, same in rows:
        ratios = [b / s for b, s in zip(baseline, seconds)]
        median = statistics.median(seconds)
        print(f"| {name} | {wait_ms:g} | {forwards} | {median * 1e3:.1f} | {median * 1e3 / num_queries:.2f} "
              f"| {statistics.median(ratios):.1f}× ({min(ratios):.1f}-{max(ratios):.1f}) | {'yes' if same else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "mia_tool_bench_index"),
                        help="where the full index is built once and reused")
    parser.add_argument("--num-queries", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-wait-ms", type=float, default=2.0)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
