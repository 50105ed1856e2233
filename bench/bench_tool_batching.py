"""Benchmark: local search micro-batched across concurrent callers vs one query at a time.

On the full wiki-offline index (10,033 passages, all-MiniLM-L6-v2, FAISS IndexFlatIP; built once
into ``--cache-dir`` and reused), times ``--num-queries`` searches (top-3) four ways:
  batched     all callers concurrent, ``batch_wait_ms`` > 0: one encoder forward + one FAISS search
              for the whole micro-batch (what G rollouts × many questions get in the loop)
  queued      all callers concurrent, ``batch_wait_ms`` = 0: merges only what is already queued
  one-by-one  sequential awaits of single-query calls with ``batch_wait_ms`` = 0 (the reference's
              one request per query, minus its HTTP hop)
  reference   the reference's topology: the same search as a service in its own process
              (``retrieval_service.py``), one HTTP POST per query, one after another
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
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import free_port, launch  # noqa: E402

from mia_engine.config.memory import EmbedderConfig  # noqa: E402
from mia_engine.memory.embedder import Embedder  # noqa: E402
from mia_engine.tools.corpus import WIKI_OFFLINE, Passage, build_index, load_corpus  # noqa: E402
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


class HttpSearch:
    """The retrieval service over HTTP, one POST per ``search`` call (the reference's tool call)."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.AsyncClient(base_url=base_url, timeout=120)

    async def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        response = await self.client.post("/retrieve", json={"queries": queries, "topk": top_k})
        response.raise_for_status()
        return [[Passage(p["title"], p["text"]) for p in r] for r in response.json()["result"]]

    def close(self) -> None:
        pass


async def run_once(search: LocalSearch | HttpSearch, encoder: CountingEncoder, run: Callable[..., Awaitable],
                   queries: list[str]) -> tuple[float, int, list[list[str]]]:
    """(seconds, encoder forwards in this process, titles) of one run of one mode."""
    encoder.num_forwards = 0
    start = time.perf_counter()
    titles = await run(search, queries)
    return time.perf_counter() - start, encoder.num_forwards, titles


async def bench(args: argparse.Namespace) -> None:
    embedder = Embedder(EmbedderConfig(batch_wait_ms=0.0))
    corpus = load_corpus(WIKI_OFFLINE)
    start = time.perf_counter()
    folder = build_index(corpus, embedder, args.cache_dir, embedder_name=embedder_name(embedder))
    build_s = time.perf_counter() - start
    queries = make_queries([p.title for p in corpus.passages], args.num_queries)
    encoder = CountingEncoder(embedder)
    service = launch("retrieval_service", [sys.executable, str(Path(__file__).parent / "retrieval_service.py"),
                                           "--index", str(folder), "--port", str(port := free_port())],
                     Path(tempfile.mkdtemp(prefix="mia-retrieval-")), port)
    await asyncio.to_thread(service.wait_ready)
    modes = [("batched", args.batch_wait_ms, batched,
              LocalSearch(folder, encoder, batch_wait_ms=args.batch_wait_ms)),
             ("queued", 0.0, batched, LocalSearch(folder, encoder, batch_wait_ms=0.0)),
             ("reference (HTTP service)", 0.0, one_by_one, HttpSearch(service.base_url)),
             ("one-by-one", 0.0, one_by_one, LocalSearch(folder, encoder, batch_wait_ms=0.0))]
    seconds: list[list[float]] = [[] for _ in modes]
    forwards, titles = [0] * len(modes), [[]] * len(modes)
    try:
        for round_index in range(args.repeats + 1):  # round 0 warms up; modes interleave so load spikes hit all
            for i, (_, _, run, search) in enumerate(modes):
                spent, forwards[i], titles[i] = await run_once(search, encoder, run, queries)
                if round_index:
                    seconds[i].append(spent)
    finally:
        for *_, search in modes:
            search.close()
        service.stop()
    batch_s, singles_s = encoder_floor(embedder, queries, args.repeats)
    embedder.close()
    rows = [(name, wait, forwards[i], seconds[i], titles[i] == titles[0]) for i, (name, wait, *_) in enumerate(modes)]
    print_table(rows, len(queries), len(corpus.passages), build_s, folder, baselines=("one-by-one", "reference (HTTP service)"))
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


def print_table(rows, num_queries: int, num_passages: int, build_s: float, folder, baselines: tuple[str, ...]) -> None:
    """Medians over the rounds; a speed-up is the median of per-round ratios (same round, same load)."""
    times = {name: seconds for name, _, _, seconds, _ in rows}
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{num_queries} searches (top-{TOP_K}) on {num_passages} passages, {len(rows[0][3])} interleaved rounds; "
          f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load}; index {folder.name} "
          f"(ready in {build_s:.1f} s)\n")
    print("| mode | batch_wait_ms | encoder forwards here | wall ms (median) | ms / query | "
          + " | ".join(f"speed-up vs {b} (median, min-max)" for b in baselines) + " | same results |")
    print("|---" * (6 + len(baselines)) + "|")
    for name, wait_ms, forwards, seconds, same in rows:
        cells = []
        for baseline in baselines:
            ratios = [b / s for b, s in zip(times[baseline], seconds)]
            cells.append(f"{statistics.median(ratios):.1f}× ({min(ratios):.1f}-{max(ratios):.1f})")
        median = statistics.median(seconds)
        print(f"| {name} | {wait_ms:g} | {forwards} | {median * 1e3:.1f} | {median * 1e3 / num_queries:.2f} | "
              + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")


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
