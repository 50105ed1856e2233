"""Raw-role chat latency and throughput: our endpoint vs ``vllm serve``, same model, same machine.

Both servers run the tiny model with the same engine settings (and the same Planner LoRA adapter);
they are measured alternately, round by round, so drift on the machine hits both alike. Requests are
greedy, so both servers generate the same tokens. Reported: p50/p99 latency of sequential requests,
and throughput of a concurrent burst, with ratios ours / vllm (latency) and vllm / ours (time).

    python bench/bench_serving.py --rounds 5 --out bench/results/serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import Server, launch_mia, launch_vllm  # noqa: E402
from bench.results_io import Result  # noqa: E402
from bench.stats import percentile  # noqa: E402
from mia_engine.config import load_config  # noqa: E402
from mia_engine.models.cache import default_home  # noqa: E402
from mia_engine.models.embedded import adapter_dir, model_dir  # noqa: E402

PROMPTS = [f"Question {i}: which river, king or city came first in the history of the world?" for i in range(64)]


async def _chat(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    start = time.perf_counter()
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, response.json()["usage"]["completion_tokens"]


async def latency_run(url: str, model: str, num_requests: int, max_tokens: int) -> tuple[list[float], int]:
    async with httpx.AsyncClient(timeout=300) as client:
        await _chat(client, url, model, "warm up", 4)
        results = [await _chat(client, url, model, PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(num_requests)]
    return [r[0] for r in results], sum(r[1] for r in results)


async def burst_run(url: str, model: str, concurrency: int, max_tokens: int) -> tuple[float, int]:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(_chat(client, url, model, PROMPTS[i % len(PROMPTS)], max_tokens)
                                         for i in range(concurrency)))
        return time.perf_counter() - start, sum(r[1] for r in results)


def measure(servers: dict[str, tuple[Server, str]], args: argparse.Namespace, result: Result) -> dict:
    samples: dict[str, dict[str, list]] = {k: {"lat": [], "lat_tokens": [], "burst_s": [], "burst_tokens": []}
                                           for k in servers}
    for round_index in range(args.rounds):
        order = list(servers) if round_index % 2 == 0 else list(reversed(servers))
        for key in order:
            server, model = servers[key]
            lat, tokens = asyncio.run(latency_run(server.base_url, model, args.requests, args.max_tokens))
            wall, burst_tokens = asyncio.run(burst_run(server.base_url, model, args.concurrency, args.max_tokens))
            s = samples[key]
            s["lat"] += lat
            s["lat_tokens"].append(tokens)
            s["burst_s"].append(wall)
            s["burst_tokens"].append(burst_tokens)
            result.add_run(server=key, round=round_index, p50_ms=percentile(lat, 0.5) * 1e3,
                           p99_ms=percentile(lat, 0.99) * 1e3, burst_s=wall, burst_tok_per_s=burst_tokens / wall,
                           latency_run_tokens=tokens, latencies_ms=[x * 1e3 for x in lat])
            print(f"round {round_index} {key}: p50 {statistics.median(lat) * 1e3:.1f} ms, "
                  f"burst {wall:.2f} s ({burst_tokens} tok)", flush=True)
    return samples


def summarize(samples: dict[str, dict[str, list]]) -> dict[str, dict[str, float]]:
    out = {}
    for key, s in samples.items():
        out[key] = {
            "p50_ms": percentile(s["lat"], 0.5) * 1e3,
            "p99_ms": percentile(s["lat"], 0.99) * 1e3,
            "burst_median_s": statistics.median(s["burst_s"]),
            "burst_tok_per_s": statistics.median(t / w for t, w in zip(s["burst_tokens"], s["burst_s"])),
            "tokens_per_latency_run": statistics.median(s["lat_tokens"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="sequential requests per latency run")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in one throughput burst")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", choices=["base", "planner"], default="planner",
                        help="the bare base model, or the Planner role (LoRA) on both servers")
    parser.add_argument("--out", type=Path, help="write the raw samples and summary as JSON")
    parser.add_argument("--ours-set", action="append", default=[], metavar="--KEY=VALUE",
                        help="config override for our server, e.g. --ours-set=--engines.tiny.executor_backend=mp")
    args = parser.parse_args()
    result = Result("serving")

    config = load_config("tiny")
    engine = config.engines["tiny"]
    base = model_dir(engine.model, default_home())
    planner = adapter_dir(config.roles["planner"].adapter, engine.model, default_home())
    ours_model = "planner" if args.model == "planner" else "tiny"
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        servers = {"mia_engine": (launch_mia(logs, "tiny", *args.ours_set), ours_model),
                   "vllm_serve": (launch_vllm(logs, base, "tiny", engine, "--lora-modules", f"planner={planner}",
                                               onednn_cache_capacity=config.cpu.onednn_cache_capacity),
                                  ours_model)}
        try:
            for server, _ in servers.values():
                server.wait_ready()
            samples = measure(servers, args, result)
        finally:
            for server, _ in servers.values():
                server.stop()
    summary = summarize(samples)
    ours, theirs = summary["mia_engine"], summary["vllm_serve"]
    ratios = {"p50_latency_ratio": ours["p50_ms"] / theirs["p50_ms"],
              "p99_latency_ratio": ours["p99_ms"] / theirs["p99_ms"],
              "burst_time_ratio": ours["burst_median_s"] / theirs["burst_median_s"]}
    print("\n| server | p50 ms | p99 ms | burst s (median) | burst tok/s | tokens/latency run |")
    print("|---|---|---|---|---|---|")
    for key, row in summary.items():
        print(f"| {key} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['burst_median_s']:.2f} | "
              f"{row['burst_tok_per_s']:.0f} | {row['tokens_per_latency_run']:.0f} |")
    print("\n" + ", ".join(f"{k} = {v:.3f}" for k, v in ratios.items()) + "  (ours / vllm serve; goal <= 1.05)")
    result.write(args.out, summary, args, echo=False, ratios=ratios)


if __name__ == "__main__":
    main()
