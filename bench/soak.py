"""Soak: mixed traffic against the real server for a fixed time; errors, memory growth, learning.

    python bench/soak.py --minutes 30 --out bench/results/soak.json

One ``python -m mia_engine serve`` subprocess on 127.0.0.1 (``--config``, tiny by default) receives,
concurrently and without pause: raw-role chat completions, ``mia`` questions with ``learn: true`` and
their gold answers (the test-time-learning stream: memory writes and GRPO updates), and memory
searches. Every ``--sample-s`` the RSS of the server and its children (engine cores) is sampled, and
``/v1/adapters`` and ``/v1/memory/stats`` read (the store grows by design, up to its capacities).
Reported: requests and errors per kind (any non-200 or transport error is an error), RSS growth after
the warm-up (the first ``--warmup-fraction`` of the run) and each process's RSS slope (after the warm-up,
second half, last third), of RSS's anonymous part, and of its floor (its lowest RSS per 5-minute window:
what it holds between bursts such as learner steps), the serving process's heap trims, adapter versions
published, and the learning stream's answer accuracy per window of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import generated_admin_key, launch_mia  # noqa: E402
from bench.results_io import Result  # noqa: E402
from bench.stats import process_tree, report  # noqa: E402
from mia_engine.agent.answer_match import is_match  # noqa: E402


def load_questions(path: Path) -> list[tuple[str, list[str]]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    questions = []
    for row in rows:
        answers = row.get("answers", row.get("answer", []))
        questions.append((row["question"], [answers] if isinstance(answers, str) else list(answers)))
    return questions


class Soak:
    def __init__(self, base_url: str, questions: list[tuple[str, list[str]]], deadline: float, seed: int,
                 admin_key: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=900, headers={"Authorization": f"Bearer {admin_key}"})
        self.questions = questions
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.error_samples: list[str] = []
        self.learning: list[tuple[float, bool]] = []
        """(seconds since start, answer matched the gold answer) of each learning question."""
        self.start = time.monotonic()

    async def _post(self, kind: str, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.requests[kind] += 1
        try:
            response = await self.http.post(path, json=body)
        except httpx.HTTPError as err:
            self._error(kind, f"{type(err).__name__}: {err}")
            return None
        if response.status_code != 200:
            self._error(kind, f"{response.status_code}: {response.text[:300]}")
            return None
        return response.json()

    def _error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{kind}: {detail}")

    async def chat(self) -> None:
        while time.monotonic() < self.deadline:
            question, _ = self.rng.choice(self.questions)
            await self._post("chat", "/v1/chat/completions", {
                "model": "manager", "messages": [{"role": "user", "content": question}], "max_tokens": 32})

    async def learn(self) -> None:
        while time.monotonic() < self.deadline:
            question, answers = self.rng.choice(self.questions)
            out = await self._post("mia_learn", "/v1/chat/completions", {
                "model": "mia", "messages": [{"role": "user", "content": question}], "learn": True,
                "ground_truth": answers})
            if out is not None:
                answer = out["choices"][0]["message"]["content"] or ""
                self.learning.append((time.monotonic() - self.start, is_match(answer, answers)))

    async def memory_search(self) -> None:
        while time.monotonic() < self.deadline:
            question, _ = self.rng.choice(self.questions)
            await self._post("memory_search", "/v1/memory/search", {"question": question})
            await asyncio.sleep(0.2)

    async def adapter_versions(self) -> int:
        """The Planner's newest adapter version (1 = the initial one; -1 = unreadable)."""
        try:
            body = (await self.http.get("/v1/adapters")).json()
        except (httpx.HTTPError, ValueError, KeyError):
            return -1
        return max((v["version"] for v in body["data"] if v["role"] == "planner"), default=0)

    async def heap_trims(self) -> dict[str, float]:
        """The serving process's heap trims so far (``mia_malloc_trim_*`` on ``/metrics``): count, seconds,
        MB of RSS given back; {} = unreadable."""
        try:
            text = (await self.http.get("/metrics")).text
        except httpx.HTTPError:
            return {}
        names = {"mia_malloc_trim_seconds_count": "trims", "mia_malloc_trim_seconds_sum": "trim_s",
                 "mia_malloc_trim_released_bytes_total": "released_mb"}
        values = {names[sample.name]: sample.value for family in text_string_to_metric_families(text)
                  for sample in family.samples if sample.name in names}
        if "released_mb" in values:
            values["released_mb"] /= 2**20
        return values

    async def store_size(self) -> tuple[int, int]:
        """(workflow memories, Meta Plan pairs) in the server's store; (-1, -1) = unreadable."""
        try:
            body = (await self.http.get("/v1/memory/stats")).json()
            return int(body["num_entries"]), int(body["num_meta_plans"])
        except (httpx.HTTPError, ValueError, KeyError):
            return -1, -1


def tree_rss_mb(pid: int) -> tuple[dict[str, float], dict[str, float]]:
    """(RSS, its anonymous part) of the server and each of its child processes (the engine core, its
    worker, the learner), by ``name[pid]``, in MB: what grows is told apart, not only the sum. The
    anonymous part (``RssAnon``: heaps, arenas, tensors) leaves out file pages (libraries' code paged in
    as new paths run), which RSS counts too."""
    try:
        members = process_tree(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return {}, {}
    rss, anon = {}, {}
    for member in members:
        try:
            name, info = f"{member.name()}[{member.pid}]", member.memory_info()
        except psutil.NoSuchProcess:
            continue
        rss[name] = info.rss / 2**20
        anon[name] = (info.rss - info.shared) / 2**20  # Linux: shared = RssFile + RssShmem, the rest is RssAnon
    return rss, anon


async def sample(soak: Soak, pid: int, every_s: float, samples: list[dict[str, Any]]) -> None:
    while time.monotonic() < soak.deadline:
        entries, pairs = await soak.store_size()
        by_process, anon = tree_rss_mb(pid)
        samples.append({"t_s": time.monotonic() - soak.start, "rss_mb": sum(by_process.values()),
                        "rss_by_process_mb": by_process, "anon_by_process_mb": anon,
                        "adapter_version": await soak.adapter_versions(),
                        "memories": entries, "meta_plans": pairs, "heap_trims": await soak.heap_trims()})
        await asyncio.sleep(every_s)


def rss_slopes(samples: list[dict[str, Any]], duration_s: float, warmup_fraction: float,
               key: str = "rss_by_process_mb") -> dict[str, dict[str, float]]:
    """Least-squares slope of each process's ``key`` (RSS, or its anonymous part), in MB/min, over the run
    after the warm-up, its second half and its last third (a process still settling shows a smaller slope
    late in the run)."""
    samples = [s for s in samples if key in s]
    names = samples[-1][key] if samples else {}
    spans = {"after_warmup": warmup_fraction, "second_half": 0.5, "last_third": 2 / 3}
    slopes: dict[str, dict[str, float]] = {}
    for span, fraction in spans.items():
        slopes[span] = {}
        for name in names:
            points = [(s["t_s"] / 60, s[key][name]) for s in samples
                      if s["t_s"] >= fraction * duration_s and name in s[key]]
            if len(points) > 2:
                slopes[span][name] = round(float(np.polyfit(*zip(*points), 1)[0]), 3)
    return slopes


FLOOR_WINDOW_S = 300.0
"""Seconds per window of ``floor_slopes``: longer than a learner step on the embedded default (one to two
minutes on a 2-core CPU), so that every window holds a sample taken between two bursts."""


def floor_slopes(samples: list[dict[str, Any]], duration_s: float, warmup_fraction: float,
                 key: str = "rss_by_process_mb", window_s: float = FLOOR_WINDOW_S) -> dict[str, dict[str, float]]:
    """``rss_slopes`` of each process's floor: its lowest ``key`` in each ``window_s`` window, at the window's
    middle. A burst's working memory (a learner step's activations, freed and trimmed when the step ends)
    comes and goes; what stays between the bursts is what a leak or a ratchet raises. A process busy with
    bursts most of the time would make the plain least-squares slope read whether the last samples fell in
    a burst; the floor reads what it holds between them."""
    samples = [s for s in samples if key in s]
    windows_by_index: dict[int, list[dict[str, Any]]] = {}
    for s in samples:
        windows_by_index.setdefault(int(s["t_s"] // window_s), []).append(s)
    floors = []
    for index, members in sorted(windows_by_index.items()):
        names = set().union(*(m[key] for m in members))
        floors.append({"t_s": (index + 0.5) * window_s,
                       key: {n: min(m[key][n] for m in members if n in m[key]) for n in names}})
    return rss_slopes(floors, duration_s, warmup_fraction, key)


def windows(learning: list[tuple[float, bool]], duration_s: float, num: int) -> list[dict[str, float]]:
    size = duration_s / num
    out = []
    for i in range(num):
        hits = [ok for t, ok in learning if i * size <= t < (i + 1) * size]
        out.append({"from_s": i * size, "questions": len(hits), "accuracy": sum(hits) / len(hits) if hits else None})
    return out


async def main_async(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mia-soak-"))
    server = launch_mia(tmp, args.config, *args.set)
    try:
        await asyncio.to_thread(server.wait_ready)
        duration = args.minutes * 60
        soak = Soak(server.base_url, load_questions(args.dataset), time.monotonic() + duration, args.seed,
                    generated_admin_key(tmp))  # learn: true is in the admin scope
        samples: list[dict[str, Any]] = []
        workers = ([soak.chat() for _ in range(args.chat_workers)] + [soak.learn() for _ in range(args.learn_workers)]
                   + [soak.memory_search() for _ in range(args.memory_workers)])
        await asyncio.gather(sample(soak, server.process.pid, args.sample_s, samples), *workers)
        is_healthy = (await soak.http.get("/health")).status_code == 200
        await soak.http.aclose()
    finally:
        server.stop()
    warm = [s for s in samples if s["t_s"] >= args.warmup_fraction * duration]
    growth = warm[-1]["rss_mb"] - warm[0]["rss_mb"] if len(warm) > 1 else 0.0
    by_process = {name: warm[-1]["rss_by_process_mb"][name] - mb for name, mb in warm[0]["rss_by_process_mb"].items()
                  if name in warm[-1]["rss_by_process_mb"]} if len(warm) > 1 else {}
    return {
        "minutes": args.minutes, "config": args.config, "requests": dict(soak.requests), "errors": dict(soak.errors),
        "num_errors": sum(soak.errors.values()), "error_samples": soak.error_samples, "healthy_at_end": is_healthy,
        "rss_after_warmup_mb": warm[0]["rss_mb"] if warm else None, "rss_end_mb": warm[-1]["rss_mb"] if warm else None,
        "rss_growth_after_warmup_mb": growth, "rss_growth_after_warmup_by_process_mb": by_process,
        "rss_slope_mb_per_min": rss_slopes(samples, duration, args.warmup_fraction),
        "anon_slope_mb_per_min": rss_slopes(samples, duration, args.warmup_fraction, "anon_by_process_mb"),
        "floor_slope_mb_per_min": floor_slopes(samples, duration, args.warmup_fraction),
        "store_growth_after_warmup": {key: warm[-1][key] - warm[0][key] for key in ("memories", "meta_plans")}
        if len(warm) > 1 else None,
        "adapter_versions_published": max((s["adapter_version"] for s in samples), default=0) - 1,
        "learning_accuracy_by_window": windows(soak.learning, duration, args.windows),
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--dataset", type=Path, default=Path(__file__).parent / "devset_wiki.jsonl")
    parser.add_argument("--chat-workers", type=int, default=4)
    parser.add_argument("--learn-workers", type=int, default=8)
    parser.add_argument("--memory-workers", type=int, default=2)
    parser.add_argument("--sample-s", type=float, default=15)
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="--KEY=VALUE",
                        help="extra serve arguments, e.g. --set=--learner.batch_size=4")
    args = parser.parse_args()
    result = Result("soak")
    summary = asyncio.run(main_async(args))
    result.add_run(minutes=summary["minutes"], num_errors=summary["num_errors"],  # one soak is one run
                   requests=sum(summary["requests"].values()), rss_slope_mb_per_min=summary["rss_slope_mb_per_min"],
                   anon_slope_mb_per_min=summary["anon_slope_mb_per_min"],
                   floor_slope_mb_per_min=summary["floor_slope_mb_per_min"])
    report(summary, args.out, result=result, args=args)


if __name__ == "__main__":
    main()
