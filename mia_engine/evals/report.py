"""What ``eval`` prints and writes: a table of every pass, the JSON of everything, and a PNG of
accuracy by test-time-learning epoch with the baselines as reference lines.

Each measured pass is also compared with a reference baseline question by question (the questions
one got right and the other did not, and an exact sign test on them), on the same split and in the same
seed's run: on a small dev set and a small model a few points between two configs are often chance, and
the table should say so rather than leave it to the reader. Right and wrong are by the run's headline
metric (``match``, ``exact`` or the paper's ``judge``). With several seeds each rate is shown as median
(min–max) over the runs and each run's pairing is listed. Plots need matplotlib, the ``plot`` extra
(``pip install 'mia-engine[plot]'``)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from .results import BASELINES, METRICS, TTL_MODES, PassResult

COLUMNS = ("mode", "epoch", "split", *METRICS, "found", "tool calls", "tokens", "s/question", "vs reference")
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


class Spread(msgspec.Struct, frozen=True):
    """One rate over the ``--seeds`` runs."""

    median: float
    min: float
    max: float
    per_seed: list[float]

    def __str__(self) -> str:
        if len(self.per_seed) == 1:
            return f"{self.median:.3f}"
        return f"{self.median:.3f} ({self.min:.3f}–{self.max:.3f})"


def spread(values: Iterable[float]) -> Spread:
    values = list(values)
    return Spread(statistics.median(values), min(values), max(values), values)


def pass_name(p: PassResult, main_split: str | None = None) -> str:
    """``mode`` for a baseline, ``mode/epoch`` for a TTL measurement, ``mode/epoch explore`` for a TTL
    learning pass; `` @split`` added for a split other than ``main_split``."""
    name = p.mode if p.epoch is None else f"{p.mode}/{p.epoch}" + (" explore" if p.is_learning else "")
    return name if main_split is None or p.split == main_split else f"{name} @{p.split}"


def paired(this: PassResult, reference: PassResult, metric: str = "match") -> Paired:
    """Question by question over the questions both passes answered (matched by id)."""
    right = {p.id: p.is_correct(metric) for p in reference.predictions}
    both = [(p.is_correct(metric), right[p.id]) for p in this.predictions if p.id in right]
    wins = sum(a and not b for a, b in both)
    losses = sum(b and not a for a, b in both)
    return Paired(wins, losses, sign_test(wins, losses))


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: the chance, if each question were a fair coin, of a split at least as
    uneven as ``wins`` against ``losses`` (1.0 when they are equal or both 0)."""
    num = wins + losses
    tail = sum(math.comb(num, k) for k in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2**num)


def passes_in_order(passes: list[PassResult]) -> list[PassResult]:
    """Baselines first (the main split, then any other), then each TTL variant's passes by epoch (the
    learning pass, then its measurements); within one, by seed."""
    main = main_split(passes)

    def key(p: PassResult) -> tuple:
        if p.mode in BASELINES:
            return (0, p.split != main, BASELINES.index(p.mode), 0, 0, p.seed)
        return (1, TTL_MODES.index(p.mode), p.epoch or 0, not p.is_learning, p.split != main, p.seed)

    return sorted(passes, key=key)


def main_split(passes: list[PassResult]) -> str | None:
    """The split learned from: the first pass's (the baselines and the learning passes run on it first)."""
    return passes[0].split if passes else None


def versus(passes: list[PassResult], metric: str = "match") -> tuple[str | None, dict[str, list[Paired]]]:
    """The reference baseline present (None: neither) and every other pass paired with the reference's pass
    on the same split in the same seed's run, by ``pass_name`` (one pairing per seed)."""
    ref = next((m for m in REFERENCES if any(p.mode == m for p in passes)), None)
    if ref is None:
        return None, {}
    references = {(p.split, p.seed): p for p in passes if p.mode == ref}
    pairs: dict[str, list[Paired]] = {}
    main = main_split(passes)
    for p in passes_in_order(passes):
        reference = references.get((p.split, p.seed))
        if p.mode != ref and reference is not None:
            pairs.setdefault(pass_name(p, main), []).append(paired(p, reference, metric))
    return ref, pairs


def grouped(passes: list[PassResult]) -> dict[str, list[PassResult]]:
    """The passes by ``pass_name``, in table order, each group one pass per seed."""
    groups: dict[str, list[PassResult]] = {}
    main = main_split(passes)
    for p in passes_in_order(passes):
        groups.setdefault(pass_name(p, main), []).append(p)
    return groups


def table(passes: list[PassResult], metric: str = "match") -> str:
    """One line per pass (over the seeds); a TTL learning pass is marked ``(explore)``; the metric columns
    are match, exact and (when judged) judge; the last pairs each pass with the reference baseline by
    ``metric`` (named in the header)."""
    ref, pairs = versus(passes, metric)
    is_judged = any(p.judged is not None for p in passes)
    metrics = [m for m in METRICS if m != "judge" or is_judged]
    header = ["mode", "epoch", "split", *metrics, *COLUMNS[len(METRICS) + 3:-1],
              f"vs {ref} ({metric})" if ref else ""]
    lines = [header]
    for name, group in grouped(passes).items():
        p = group[0]
        mode = f"{p.mode} (explore)" if p.is_learning else p.mode
        rates = [str(spread(q.rate(m) or 0.0 for q in group)) for m in metrics]
        averages = [spread(getattr(q, field) for q in group).median
                    for field in ("answers_found", "tool_calls_per_question", "tokens_per_question",
                                  "seconds_per_question")]
        lines.append([mode, "" if p.epoch is None else str(p.epoch), p.split, *rates, f"{averages[0]:.3f}",
                      f"{averages[1]:.2f}", f"{averages[2]:.0f}", f"{averages[3]:.1f}",
                      "; ".join(map(str, pairs.get(name, [])))])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def summary(passes: list[PassResult]) -> dict[str, Any]:
    """Per ``pass_name``: its mode, epoch, split, whether it learned, and each metric's spread over the seeds."""
    out = {}
    for name, group in grouped(passes).items():
        p = group[0]
        rates = {m: msgspec.to_builtins(spread(q.rate(m) for q in group)) if group[0].rate(m) is not None else None
                 for m in METRICS}
        out[name] = {"mode": p.mode, "epoch": p.epoch, "split": p.split, "is_learning": p.is_learning, **rates}
    return out


def report(passes: list[PassResult], run: dict[str, Any], metric: str = "match") -> dict[str, Any]:
    """The JSON document: the run's settings; ``accuracy`` (match) and ``passes`` as before several seeds
    and splits (seed 0: each baseline on the learned split, each TTL variant's passes in order);
    ``summary`` (every pass name's metrics over the seeds); ``vs`` (the pairing with the reference, seed 0's
    in ``passes`` and every seed's in ``per_seed``); and ``other_passes`` (the passes ``passes`` leaves out:
    other seeds, the baselines on the unseen split)."""
    main = main_split(passes)
    first = [p for p in passes if p.seed == 0]
    legacy: dict[str, Any] = {p.mode: p for p in first if p.mode in BASELINES and p.split == main}
    for mode in (m for m in TTL_MODES if any(p.mode == m for p in first)):
        legacy[mode] = [p for p in passes_in_order(first) if p.mode == mode]
    accuracy: dict[str, Any] = {m: legacy[m].accuracy for m in BASELINES if m in legacy}
    for mode in (m for m in TTL_MODES if m in legacy):
        accuracy[mode] = {str(p.epoch): p.accuracy for p in legacy[mode] if not p.is_learning and p.split == main}
    kept = {id(p) for group in legacy.values() for p in (group if isinstance(group, list) else [group])}
    ref, pairs = versus(passes, metric)
    return {**run, "metric": metric, "accuracy": accuracy, "summary": summary(passes),
            "vs": {"reference": ref, "metric": metric, "passes": {n: msgspec.to_builtins(v[0]) for n, v in pairs.items()},
                   "per_seed": msgspec.to_builtins(pairs)},
            "passes": msgspec.to_builtins(legacy),
            "other_passes": msgspec.to_builtins([p for p in passes_in_order(passes) if id(p) not in kept])}


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


def curves(passes: list[PassResult], metric: str) -> dict[str, list[tuple[int, float]]]:
    """Each TTL variant's (epoch, median rate) series: its remeasure on the learned split (epoch 0 = mia_g1
    there: the same fresh state), its explore passes, and its passes on an unseen split."""
    main = main_split(passes)
    groups = grouped(passes)
    series: dict[str, list[tuple[int, float]]] = {}
    for group in groups.values():
        p = group[0]
        if p.mode not in TTL_MODES:
            continue
        where = "" if p.split == main else f" @{p.split}"
        label = p.mode.replace("_", " ") + (" explore" if p.is_learning else "") + where
        start = groups.get("mia_g1" + where)
        if label not in series and not p.is_learning and start is not None:
            series[label] = [(0, spread(q.rate(metric) or 0.0 for q in start).median)]
        series.setdefault(label, []).append((p.epoch or 0, spread(q.rate(metric) or 0.0 for q in group).median))
    return series


def plot(passes: list[PassResult], out: Path, *, title: str, metric: str = "match") -> None:
    """Accuracy (median over the seeds) after each epoch for both TTL variants, with their explore and
    unseen-split series, and the bare, react and mia_g1 accuracies as horizontal reference lines."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in curves(passes, metric).items():
        style = ":" if "explore" in label else "--" if "@" in label else "-"
        ax.plot(*zip(*points), marker="o", linestyle=style, label=label)
    groups = grouped(passes)
    for mode, style in (("bare", ":"), ("react", "-."), ("mia_g1", "--")):
        if mode in groups:
            rate = spread(q.rate(metric) or 0.0 for q in groups[mode]).median
            ax.axhline(rate, linestyle=style, color="grey", label=f"{mode} (reference)")
    ax.set(title=title, xlabel="test-time-learning epoch", ylabel=f"accuracy ({metric})", ylim=(-0.02, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
