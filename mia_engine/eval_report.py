"""What ``eval`` prints and writes: a table of every pass, the JSON of everything, and a PNG of
accuracy by test-time-learning epoch with the baselines as reference lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from .evaluate import BASELINES, TTL_MODES, PassResult

COLUMNS = ("mode", "epoch", "accuracy", "found", "tool calls", "tokens", "s/question")


def passes_in_order(results: dict[str, Any]) -> list[PassResult]:
    """Baselines first, then each TTL variant's passes by epoch (learning pass, then its measurement)."""
    rows = [results[m] for m in BASELINES if m in results]
    return rows + [p for m in TTL_MODES for p in results.get(m, [])]


def table(results: dict[str, Any]) -> str:
    """One line per pass; a TTL learning pass is marked ``(learn)``."""
    lines = [COLUMNS]
    for p in passes_in_order(results):
        mode = f"{p.mode} (learn)" if p.is_learning else p.mode
        lines.append((mode, "" if p.epoch is None else str(p.epoch), f"{p.accuracy:.3f}", f"{p.answers_found:.3f}",
                      f"{p.tool_calls_per_question:.2f}", f"{p.tokens_per_question:.0f}",
                      f"{p.seconds_per_question:.1f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def report(results: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: the run's settings, a summary per mode, and every pass with its predictions."""
    summary: dict[str, Any] = {m: results[m].accuracy for m in BASELINES if m in results}
    for mode in (m for m in TTL_MODES if m in results):
        summary[mode] = {str(p.epoch): p.accuracy for p in results[mode] if not p.is_learning}
    passes = {m: msgspec.to_builtins(v) for m, v in results.items()}
    return {**run, "accuracy": summary, "passes": passes}


def write_json(document: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, ensure_ascii=False))


def plot(results: dict[str, Any], out: Path, *, title: str) -> None:
    """Accuracy after each epoch for both TTL variants (epoch 0 = mia_g1: the same fresh state), with
    the bare, react and mia_g1 accuracies as horizontal reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    start = results.get("mia_g1")
    for mode, marker in zip(TTL_MODES, "os"):
        measured = [p for p in results.get(mode, []) if not p.is_learning]
        points = ([(0, start.accuracy)] if start is not None else []) + [(p.epoch, p.accuracy) for p in measured]
        if points:
            ax.plot(*zip(*points), marker=marker, label=mode.replace("_", " "))
    for mode, style in (("bare", ":"), ("react", "-."), ("mia_g1", "--")):
        if mode in results:
            ax.axhline(results[mode].accuracy, linestyle=style, color="grey", label=f"{mode} (reference)")
    ax.set(title=title, xlabel="test-time-learning epoch", ylabel="accuracy (answer match)", ylim=(-0.02, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
