"""Small helpers shared by the benchmarks: percentiles and the JSON report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1] (p99 of 64 samples = the largest but one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(summary: Any, out: Path | None, **extra: Any) -> None:
    """Print the summary as JSON and, with ``out``, write it there (plus ``extra`` fields)."""
    print(json.dumps(summary, indent=2))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**extra, "summary": summary} if extra else summary, indent=2))
