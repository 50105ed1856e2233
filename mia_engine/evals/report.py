"""What ``eval`` prints and writes: a table of every pass, the JSON of everything, and a PNG of
accuracy by test-time-learning epoch with the baselines as reference lines.

Each measured pass is also compared with a reference baseline question by question (the questions
one got right and the other did not, and an exact sign test on them): on a small dev set and a small
model a few points between two configs are often chance, and the table should say so rather than
leave it to the reader. Plots need matplotlib, the ``plot`` extra (``pip install 'mia-engine[plot]'``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec

from .results import BASELINES, TTL_MODES, PassResult

COLUMNS = ("mode", "epoch", "accuracy", "found", "tool calls", "tokens", "s/question", "vs reference")
REFERENCES = ("react", "bare")
"""The baseline each pass is paired with: ReAct (MIA's goal is to beat it), else the bare model."""


class Paired(msgspec.Struct, frozen=True):
    """A pass against the reference on the same questions."""

    wins: int
    """Questions this pass answered right and the reference wrong."""
    losses: int
    """Questions the reference answered right and this pass wrong."""
    p_value: float
    """Exact two-sided sign test on wins vs losses (1.0 when they are equal or both 0): the chance of a
    split at least this uneven if both were equally good."""

    def __str__(self) -> str:
        return f"+{self.wins} -{self.losses} p={self.p_value:.2f}"


def pass_name(p: PassResult) -> str:
    """``mode`` for a baseline, ``mode/epoch`` for a TTL pass."""
    return p.mode if p.epoch is None else f"{p.mode}/{p.epoch}"


def paired(this: PassResult, reference: PassResult) -> Paired:
    """Question by question over the questions both passes answered (matched by id)."""
    right = {p.id: p.is_match for p in reference.predictions}
    both = [(p.is_match, right[p.id]) for p in this.predictions if p.id in right]
    wins = sum(a and not b for a, b in both)
    losses = sum(b and not a for a, b in both)
    return Paired(wins, losses, sign_test(wins, losses))


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: the chance, if each question were a fair coin, of a split at least as
    uneven as ``wins`` against ``losses`` (1.0 when they are equal or both 0)."""
    num = wins + losses
    tail = sum(math.comb(num, k) for k in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2**num)


def versus(results: dict[str, Any]) -> tuple[str | None, dict[str, Paired]]:
    """The reference baseline present (None: neither) and every other measured pass paired with it,
    by ``pass_name`` (learning passes are not measurements, so they are left out)."""
    ref = next((m for m in REFERENCES if m in results), None)
    if ref is None:
        return None, {}
    return ref, {pass_name(p): paired(p, results[ref]) for p in passes_in_order(results)
                 if p.mode != ref and not p.is_learning}


def passes_in_order(results: dict[str, Any]) -> list[PassResult]:
    """Baselines first, then each TTL variant's passes by epoch (learning pass, then its measurement)."""
    rows = [results[m] for m in BASELINES if m in results]
    return rows + [p for m in TTL_MODES for p in results.get(m, [])]


def table(results: dict[str, Any]) -> str:
    """One line per pass; a TTL learning pass is marked ``(learn)``; the last column pairs each
    measured pass with the reference baseline (named in the header)."""
    ref, pairs = versus(results)
    lines = [(*COLUMNS[:-1], f"vs {ref}" if ref else "")]
    for p in passes_in_order(results):
        mode = f"{p.mode} (learn)" if p.is_learning else p.mode
        pair = pairs.get(pass_name(p)) if not p.is_learning else None
        lines.append((mode, "" if p.epoch is None else str(p.epoch), f"{p.accuracy:.3f}", f"{p.answers_found:.3f}",
                      f"{p.tool_calls_per_question:.2f}", f"{p.tokens_per_question:.0f}",
                      f"{p.seconds_per_question:.1f}", "" if pair is None else str(pair)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def report(results: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: the run's settings, a summary per mode, the pairing of each measured pass
    with the reference baseline (``vs``), and every pass with its predictions."""
    summary: dict[str, Any] = {m: results[m].accuracy for m in BASELINES if m in results}
    for mode in (m for m in TTL_MODES if m in results):
        summary[mode] = {str(p.epoch): p.accuracy for p in results[mode] if not p.is_learning}
    ref, pairs = versus(results)
    passes = {m: msgspec.to_builtins(v) for m, v in results.items()}
    return {**run, "accuracy": summary, "vs": {"reference": ref, "passes": msgspec.to_builtins(pairs)},
            "passes": passes}


def write_json(document: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, ensure_ascii=False))


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only ``Agg`` backend; without matplotlib, exit with one line that
    names the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("python -m mia_engine: error: --plot needs matplotlib: "
                         "pip install 'mia-engine[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: dict[str, Any], out: Path, *, title: str) -> None:
    """Accuracy after each epoch for both TTL variants (epoch 0 = mia_g1: the same fresh state), with
    the bare, react and mia_g1 accuracies as horizontal reference lines."""
    plt = pyplot()
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
