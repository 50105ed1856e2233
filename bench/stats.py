"""Small helpers shared by the benchmarks: percentiles, the JSON report, per-process CPU time and the
serving metrics' breakdown."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry

from bench.results_io import Result


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1] (p99 of 64 samples = the largest but one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(summary: Any, out: Path | None, *, result: Result, **extra: Any) -> dict[str, Any]:
    """Print the summary as JSON and, with ``out``, write the result file there: ``result``'s ``meta`` and
    ``runs`` (``bench/results_io.py``), the summary, and ``extra`` fields (``args=``...)."""
    return result.write(out, summary, **extra)


def process_tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and every process under it (a server and the engine processes it spawned); [] once
    ``root`` is gone. A member may still end before it is read: callers skip ``NoSuchProcess``."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of this process and every process under it, by pid, with a
    label (``benchmark`` for this one, else the process name vLLM sets: ``VLLM::EngineCore``, ...)."""
    me = psutil.Process()
    times: dict[int, tuple[str, float]] = {}
    for member in process_tree(me):
        try:
            cpu = member.cpu_times()
            label = "benchmark" if member.pid == me.pid else member.name()
            times[member.pid] = (f"{label}[{member.pid}]", cpu.user + cpu.system)
        except psutil.NoSuchProcess:
            continue
    return times


def cpu_spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
              min_s: float = 0.05) -> dict[str, float]:
    """CPU seconds each process spent between two ``tree_cpu_s`` snapshots (idle ones left out), so a
    benchmark says which process its time went to, not only the wall time."""
    spent = {label: seconds - before.get(pid, (label, 0.0))[1] for pid, (label, seconds) in after.items()}
    return {label: round(s, 2) for label, s in sorted(spent.items(), key=lambda kv: -kv[1]) if s >= min_s}


_BREAKDOWN_SERIES = {"mia_role_prompt_tokens_total": "prompt", "mia_role_prefix_cached_tokens_total": "cached",
                     "mia_role_completion_tokens_total": "completion",
                     "mia_research_stage_seconds_sum": "stage_seconds", "mia_research_stage_seconds_count": "stage_count"}


def metrics_breakdown(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """What the benchmarks report from the series ``/metrics`` serves (``Services.metrics.registry``): per
    role the prefix-cache hit rate (cached / prompt tokens) and its prompt and generated tokens, per
    research stage its total seconds and count."""
    totals: dict[str, dict[str, float]] = {key: {} for key in _BREAKDOWN_SERIES.values()}
    for family in registry.collect():
        for sample in family.samples:
            key = _BREAKDOWN_SERIES.get(sample.name)
            if key is not None:
                totals[key][sample.labels.get("role") or sample.labels.get("stage", "")] = sample.value
    hit_rate = {role: totals["cached"].get(role, 0.0) / n for role, n in totals["prompt"].items() if n}
    return {"prefix_hit_rate": hit_rate, "prompt_tokens": totals["prompt"], "completion_tokens": totals["completion"],
            "stage_seconds": totals["stage_seconds"], "stage_count": totals["stage_count"]}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2


def has_malloc_counters() -> bool:
    """glibc's ``mallinfo2`` is there (glibc 2.33 or later)."""
    return _mallinfo2() is not None


def malloc_bytes_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back, over every arena (every thread's), after a
    garbage collection: what this process holds, without the free pages its RSS also counts."""
    gc.collect()
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        raise RuntimeError("needs glibc's mallinfo2 (glibc 2.33 or later)")
    return mallinfo2().uordblks
