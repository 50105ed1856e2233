"""Small statistics shared by the benchmarks."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1] (p99 of 64 samples = the largest but one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
