"""Test-time learning under traffic: GRPO step time, publish/swap latency, and p99 chat latency of the
`planner` role while updates are published vs idle, in one run, on the tiny model (issue 5).

    python bench/bench_ttl.py --rounds 3 --updates 3

Swap latency = optimizer step end → the new version serves new requests (folder write + engine load +
switch), as the server reports it; p99 latency compares planner requests sent while GRPO updates run
and publish (``POST /v1/adapters/planner/grpo``) with the same requests on an idle learner.
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

from bench.servers import generated_admin_key, launch_mia  # noqa: E402
from bench.results_io import Result  # noqa: E402
from bench.stats import percentile, report  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a plan to find the year the oldest university was founded."}]


async def chat_load(client: httpx.AsyncClient, num_requests: int, concurrency: int) -> tuple[list[float], int]:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        async with gate:
            start = time.perf_counter()
            response = await client.post("/v1/chat/completions", json={
                "model": "planner", "messages": [{"role": "user", "content": f"plan {i}"}], "max_tokens": 24,
                "temperature": 0})
            latencies.append(time.perf_counter() - start)
            failures += response.status_code != 200

    await asyncio.gather(*(one(i) for i in range(num_requests)))
    return latencies, failures


async def updates(client: httpx.AsyncClient, num_updates: int) -> list[dict]:
    reports = []
    for i in range(num_updates):
        completions = [{"text": f"step {j} search", "reward": float(j == i % 4)} for j in range(4)]
        response = await client.post("/v1/adapters/planner/grpo",
                                     json={"groups": [{"messages": PROMPT, "completions": completions}]})
        reports.append(response.json())
    return reports


async def main_async(args: argparse.Namespace, result: Result) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mia-ttl-bench-"))
    server = launch_mia(tmp, "tiny")
    await asyncio.to_thread(server.wait_ready)
    idle: list[float] = []
    busy: list[float] = []
    reports: list[dict] = []
    failures = 0
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300,
                                     headers={"Authorization": f"Bearer {generated_admin_key(tmp)}"}) as client:
            await chat_load(client, 8, 4)  # warm up
            for round_index in range(args.rounds):
                lat_idle, failed_idle = await chat_load(client, args.requests, args.concurrency)
                idle += lat_idle
                (lat, failed), round_reports = await asyncio.gather(
                    chat_load(client, args.requests, args.concurrency), updates(client, args.updates))
                busy += lat
                failures += failed_idle + failed
                reports += round_reports
                swaps = [r["publish_seconds"] * 1e3 for r in round_reports if r.get("is_published")]
                result.add_run(round=round_index, idle_p50_ms=statistics.median(lat_idle) * 1e3,
                               idle_p99_ms=percentile(lat_idle, 0.99) * 1e3,
                               updating_p50_ms=statistics.median(lat) * 1e3,
                               updating_p99_ms=percentile(lat, 0.99) * 1e3,
                               p99_ratio=percentile(lat, 0.99) / percentile(lat_idle, 0.99),
                               failures=failed_idle + failed, published=len(swaps),
                               swap_ms_max=max(swaps) if swaps else None)
    finally:
        server.stop()
    published = [r for r in reports if r.get("is_published")]
    return {
        "idle_p50_ms": statistics.median(idle) * 1e3, "idle_p99_ms": percentile(idle, 0.99) * 1e3,
        "updating_p50_ms": statistics.median(busy) * 1e3, "updating_p99_ms": percentile(busy, 0.99) * 1e3,
        "p99_ratio": percentile(busy, 0.99) / percentile(idle, 0.99), "failures": failures,
        "updates": len(reports), "published": len(published),
        "step_s_median": statistics.median(r["step"]["step_seconds"] for r in published) if published else None,
        "swap_ms_median": statistics.median(r["publish_seconds"] for r in published) * 1e3 if published else None,
        "swap_ms_max": max(r["publish_seconds"] for r in published) * 1e3 if published else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64, help="planner requests per phase")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--updates", type=int, default=3, help="GRPO updates published per busy phase")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = Result("ttl")
    report(asyncio.run(main_async(args, result)), args.out, result=result, args=args)


if __name__ == "__main__":
    main()
