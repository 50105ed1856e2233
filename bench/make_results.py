"""Writes bench/RESULTS.md from the result files under bench/results/: the current figure of each
measure, each the median over the runs its file kept with min–max and n, a link to the file, and the
file's machine and commit (its ``meta`` block, ``bench/results_io.py``; "no provenance recorded" for a
file written before that convention).

    python bench/make_results.py            # write bench/RESULTS.md
    python bench/make_results.py --check    # exit 1 if bench/RESULTS.md is not what this would write

Which file a section shows: the latest file with ``meta`` of its benchmark where there is one, else the
file the section names (written before the convention). Every other file under bench/results/ is
history (``bench/history/``). The page holds no figure that is not read from a file here.
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results_io import RESULTS, is_run_number, provenance  # noqa: E402

BENCH = Path(__file__).resolve().parent
PAGE = BENCH / "RESULTS.md"
MAX_LINES = 300

LEGACY_MACHINES = {
    # What the hand-written page (bench/history/RESULTS-2026-11.md) named as each older file's machine:
    # the file itself records none. Its legend: EPYC-bf16 = AMD EPYC with AVX-512 and avx512_bf16,
    # EPYC-512 = AMD EPYC with AVX-512, EPYC-AVX2 = AVX2 only, Xeon-bf16 = Intel Xeon with avx512_bf16;
    # all 2-core VMs with 23 GiB.
    "research_peer_v18.json": "CPU EPYC-bf16", "research_default_engine.json": "CPU EPYC-512",
    "serving.json": "CPU EPYC-512", "serving_run2.json": "CPU EPYC-512", "latency_v18.json": "CPU EPYC-bf16",
    "latency_default_alone_v19.json": "CPU EPYC-bf16", "latency_default_37_v19.json": "CPU EPYC-bf16",
    "scaling.json": "CPU EPYC-512", "scaling_memory_default_retrieval_capped.json": "CPU EPYC-512",
    "memory_search_batching.json": "CPU EPYC-512", "ttl.json": "CPU EPYC-512",
    "quality_heldout_v19.json": "CPU EPYC-bf16", "quality_popular_v19.json": "CPU EPYC-bf16",
    "quality_longtail_v19.json": "CPU EPYC-bf16", "quality_dev_v19.json": "CPU EPYC-bf16",
    "quality_dev_v19_rule1.json": "CPU EPYC-bf16", "quality_heldout_v19_unsup.json": "CPU EPYC-bf16",
    "ab_lora_fused_tiny.json": "CPU EPYC-512", "ab_lora_stacked_pinned.json": "CPU EPYC-512",
    "ab_cpu_async_scheduling.json": "CPU EPYC-bf16", "ab_zero_lora_skip.json": "CPU EPYC-bf16",
    "ab_cpu_placement.json": "CPU EPYC-512", "ab_block32.json": "CPU EPYC-bf16", "ab_block64.json": "CPU EPYC-bf16",
    "ab_cpu_rms_norm.json": "CPU EPYC-bf16", "cpu_lora_layers.json": "CPU EPYC-512",
    "grammar_compile_lengths.json": "CPU EPYC-bf16", "grammar_compile_lengths_152000.json": "CPU EPYC-bf16",
    "soak_60min_smollm2_bf16_keep_pages.json": "CPU EPYC-bf16", "first_start_warmup.json": "CPU EPYC-bf16",
}


LEGACY_COMMANDS = {
    # The command the hand-written page gave for each older file (the file records none).
    "serving.json": "python bench/bench_serving.py --rounds 4 --requests 20 --concurrency 32 "
                    "--out bench/results/serving.json",
    "serving_run2.json": "the same, run again",
    "latency_v18.json": "python bench/bench_latency.py --questions 16 --repeats 5 --out bench/results/latency_v18.json",
    "scaling.json": "python bench/bench_scaling.py --out bench/results/scaling.json --plot bench/results/scaling.png",
    "scaling_memory_default_retrieval_capped.json":
        "python bench/bench_scaling.py --concurrency 32 --memories 0 100 10000 100000 --min-questions 96 "
        "--memory-rounds 4 --set=--memory.min_similarity=0.85 --set=--memory.num_negative=0",
    "memory_search_batching.json": "python bench/bench_memory_search.py --entries 100000 --concurrency 32 --rounds 6 "
                                   "--out bench/results/memory_search_batching.json",
    "ttl.json": "python bench/bench_ttl.py --rounds 3 --updates 3 --out bench/results/ttl.json",
    "cpu_lora_layers.json": "python bench/bench_cpu_lora.py --layers --tokens 1 8 32 128 512 --rounds 3 --min-s 0.1 "
                            "--out bench/results/cpu_lora_layers.json",
    "grammar_compile_lengths.json": "python bench/grammar_compile.py --vocab tiny,default "
                                    "--out bench/results/grammar_compile_lengths.json",
    "grammar_compile_lengths_152000.json": "python bench/grammar_compile.py --vocab 152000 --family \"maxLength k\" "
                                           "--family \"minLength k\" ...",
    "soak_60min_smollm2_bf16_keep_pages.json":
        "python bench/soak.py --config default --minutes 60 --sample-s 30 --set=--tools.index_dir=<prebuilt index> "
        "--out bench/results/soak_60min_smollm2_bf16_keep_pages.json",
    "first_start_warmup.json": "python bench/bench_first_start.py --out bench/results/first_start_warmup.json",
}


# ---- numbers -----------------------------------------------------------------------------------------


def num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}" if digits <= 3 else f"{x:.1f}"
    return f"{x:.{digits}g}"


@dataclass
class Spread:
    """A measure over runs: the median with min–max and n."""
    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def text(self, unit: str = "", bold: bool = False) -> str:
        if not self.values:
            return "–"
        mid = f"{num(self.median)}{unit}"
        mid = f"**{mid}**" if bold else mid
        if len(self.values) == 1:
            return f"{mid} (n = 1)"
        return f"{mid} ({num(min(self.values))}–{num(max(self.values))}, n = {len(self.values)})"


def spread(values: Iterable[float | None]) -> Spread:
    return Spread([float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)])


# ---- files -------------------------------------------------------------------------------------------


@dataclass
class Files:
    root: Path = RESULTS
    shown: set[str] = field(default_factory=set)
    _docs: dict[str, Any] = field(default_factory=dict)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def all_json(self) -> list[str]:
        return sorted(self.rel(p) for p in self.root.rglob("*.json"))

    def doc(self, name: str) -> Any:
        if name not in self._docs:
            try:
                self._docs[name] = json.loads((self.root / name).read_text())
            except (OSError, ValueError):
                self._docs[name] = None
        return self._docs[name]

    def with_meta(self, benchmark: str, where: Callable[[dict], bool] = lambda doc: True) -> list[str]:
        """Files with ``meta`` of ``benchmark``, oldest first (by their start time, then name)."""
        found = []
        for name in self.all_json():
            doc = self.doc(name)
            meta = provenance(doc)
            if meta and meta.get("benchmark") == benchmark and where(doc):
                found.append((meta.get("started_utc") or "", name))
        return [name for _, name in sorted(found)]

    def pick(self, benchmark: str, legacy: str | None, where: Callable[[dict], bool] = lambda doc: True) -> str | None:
        """The latest file with ``meta`` of ``benchmark`` (passing ``where``), else ``legacy`` if it exists."""
        new = self.with_meta(benchmark, where)
        if new:
            return new[-1]
        return legacy if legacy and self.doc(legacy) is not None else None

    def link(self, name: str) -> str:
        self.shown.add(name)
        return f"[`{name}`](results/{name})"

    def origin(self, name: str) -> str:
        """The file's link, machine, commit, date and load, or "no provenance recorded"."""
        meta = provenance(self.doc(name))
        if not meta:
            legacy = LEGACY_MACHINES.get(name)
            return f"{self.link(name)}: no provenance recorded" + (f" (the 2026-11 page: {legacy})" if legacy else "")
        return f"{self.link(name)}: {describe_meta(meta)}"


def describe_meta(meta: dict[str, Any]) -> str:
    machine = meta.get("machine") or {}
    cpu = (machine.get("cpu") or "CPU ?").replace("(R)", "").replace("(TM)", "").replace(" CPU", "")
    flags = machine.get("cpu_flags") or []
    what = f"{cpu}{' (' + ', '.join(flags) + ')' if flags else ''}, {machine.get('cores', '?')} cores, " \
           f"{num(machine.get('memory_gib'))} GiB"
    for gpu in machine.get("gpus") or []:
        what += f", {gpu.get('name')}"
    commit = (meta.get("commit") or "?")[:9] + (" + uncommitted changes" if meta.get("dirty") else "")
    versions = meta.get("versions") or {}
    soft = ", ".join(f"{k} {versions[k]}" for k in ("torch", "vllm") if versions.get(k))
    load = meta.get("loadavg") or {}
    start, end = (load.get("start") or [None])[0], (load.get("end") or [None])[0]
    cores = machine.get("cores") or 1
    # The load at the end counts the benchmark's own servers (vLLM's workers spin); the load at the start
    # is what else ran on the machine.
    shared = " (**shared machine**: load above its cores at the start)" if start is not None and start > cores else ""
    return (f"{what}; commit `{commit}`; {soft}; {(meta.get('started_utc') or '')[:10]}; "
            f"load {num(start)} at the start, {num(end)} at the end{shared}")


def command_of(doc: Any, fallback: str) -> str:
    meta = provenance(doc)
    return (meta or {}).get("command") or fallback


def footer(files: Files, name: str, fallback: str = "") -> str:
    """``Command: `...`. File: ...``: the file's own command, else the one the hand-written page gave; then
    the note its provenance carries, if any (what was added to the file after its run, say)."""
    doc = files.doc(name)
    command = command_of(doc, LEGACY_COMMANDS.get(name, fallback))
    note = (doc.get("meta") or {}).get("note") if isinstance(doc, dict) else None
    return (f"Command: `{command}`. " if command else "") + f"File: {files.origin(name)}." + (f" {note}." if note else "")


# ---- runs --------------------------------------------------------------------------------------------


def is_measure(key: str, value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not is_run_number(key)


def groups(runs: list[dict[str, Any]]) -> dict[tuple[tuple[str, Any], ...], list[dict[str, Any]]]:
    """Runs by the string and boolean fields that name them, in first-seen order."""
    out: dict[tuple[tuple[str, Any], ...], list[dict[str, Any]]] = {}
    for run in runs:
        key = tuple((k, v) for k, v in run.items() if isinstance(v, (str, bool)))
        out.setdefault(key, []).append(run)
    return out


def generic_table(runs: list[dict[str, Any]], max_measures: int = 5) -> list[str]:
    """Each group of runs as a row, each of its first measures as the median (min–max, n)."""
    if not runs:
        return ["(no runs recorded)"]
    lines = []
    for key, members in groups(runs).items():
        measures = [k for k, v in members[0].items() if is_measure(k, v)][:max_measures]
        label = ", ".join(f"{k} = {v}" for k, v in key) or "all runs"
        cells = "; ".join(f"{m} {spread(r.get(m) for r in members).text()}" for m in measures)
        lines.append(f"| {label} | {cells} |")
    return ["| runs | measures: median (min–max, n) |", "|---|---|", *lines]


# ---- sections ----------------------------------------------------------------------------------------

Section = Callable[[Files], list[str]]


def research_runs(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The research benchmark's runs (system, learn, round, questions_per_s); for a file written before
    the convention, read from each round's wall time (``cpu_s_by_round``). False: per-round values were
    not kept, only the file's medians (one value per system)."""
    if provenance(doc):
        return doc.get("runs", []), True
    questions = int(doc.get("args", {}).get("questions", 32))
    runs, per_round = [], True
    for key, row in doc.get("summary", {}).items():
        if "/learn=" not in key or not isinstance(row, dict) or key.startswith("speedup"):
            continue
        system, learn = key.split("/learn=")
        rounds = row.get("cpu_s_by_round")
        if rounds:
            for index, r in enumerate(rounds):
                runs.append({"system": system, "learn": learn == "on", "round": index,
                             "questions_per_s": questions / r["wall_s"]})
        else:
            per_round = False
            runs.append({"system": system, "learn": learn == "on", "round": 0,
                         "questions_per_s": row["questions_per_s"]})
    return runs, per_round


def paired_ratios(runs: list[dict[str, Any]], ours: str, other: str, learn: bool, measure: str) -> Spread:
    by = {(r["system"], r.get("round", 0)): r[measure] for r in runs if r.get("learn") == learn and measure in r}
    return spread(by[(ours, i)] / by[(other, i)] for s, i in by if s == ours and (other, i) in by)


PEER_SETTINGS = {"peer_cpu_lora_ops": ("LoRA ops", "vLLM's own", "ours (`cpu_lora_ops`)"),
                 "peer_cpu_async_scheduling": ("async scheduling", "off (vLLM's CPU default)", "on, as ours")}


def peer_differences(args: dict[str, Any]) -> list[str]:
    """The engine settings the peer's ``vllm serve`` did not share with ours in that run."""
    return [f"{what}: {theirs}" for key, (what, theirs, _) in PEER_SETTINGS.items()
            if str(args.get(key, "vllm")) != "same"]


def section_research(files: Files) -> list[str]:
    lines = ["## Research loop throughput", "",
             "Questions at once at G rollouts each, tiny model (`configs/tiny.toml`), systems alternated round by "
             "round; the ratio is ours / the other system per round (paired), then the median. The strongest peer: the "
             "same loop in-process, every LLM call to `vllm serve` with the same engine arguments; the reference "
             "topology: every LLM call over HTTP, one question at a time, rollouts in turn, one search per call. Cost "
             "per question: prompt and completion tokens, and the CPU seconds of every process of the benchmark "
             "(servers and engines included) during the pass.",
             ""]
    for title, legacy, want in (("against the strongest peer", "research_peer_v18.json", "peer"),
                                ("against the reference topology", "research_default_engine.json", "reference")):
        name = files.pick("research", legacy, lambda d, w=want: w in str(d.get("args", {}).get("systems")))
        if name is None:
            lines += [f"**{title}**: no result file.", ""]
            continue
        doc = files.doc(name)
        runs, per_round = research_runs(doc)
        args = doc.get("args", {})
        headline = []
        for learn in (False, True):
            ratio = paired_ratios(runs, "ours", want, learn, "questions_per_s")
            if not per_round:
                ratio = spread([statistics.median(r["questions_per_s"] for r in runs if r["system"] == "ours"
                                                  and r["learn"] == learn)
                                / statistics.median(r["questions_per_s"] for r in runs if r["system"] == want
                                                    and r["learn"] == learn)])
            headline.append(f"learning {'on' if learn else 'off'} {ratio.text('×', bold=True)}")
        lines.append(f"Ours / {title} ({args.get('questions')} questions, G = {args.get('rollouts')}): "
                     f"{'; '.join(headline)}.")
        if want == "peer":
            differ = peer_differences(args)
            lines.append("**Engine settings that differ**: " + (
                "; ".join(differ) + " for the peer (ours: its own LoRA ops and async scheduling). The benchmark's "
                "defaults now give the peer both (`--peer-cpu-lora-ops same --peer-cpu-async-scheduling same`)."
                if differ else "none: the peer got every engine setting ours got."))
        if want == "peer" and peer_differences(args):
            lines += research_partial(files, name)
        lines += ["", "| system | learning | questions/s: median (min–max, n rounds) | cost per question |",
                  "|---|---|---|---|"]
        for system, learn in dict.fromkeys((r["system"], r["learn"]) for r in runs):
            members = [r for r in runs if (r["system"], r["learn"]) == (system, learn)]
            lines.append(f"| {system} | {'on' if learn else 'off'} | "
                         f"{spread(r['questions_per_s'] for r in members).text()} | {cost_text(members)} |")
        lines += ["", f"Command: `{command_of(doc, 'python bench/bench_research.py ' + legacy_args(args))}`. "
                      f"File: {files.origin(name)}." + ("" if per_round or str(args.get("rounds")) == "1" else
                                                        " Per-round values not kept: the file's medians only."), ""]
    return lines


PEER_PARTIAL = ("research_peer_v17_peer_async.json", "research_peer_same_lora_ops.json")
"""Earlier runs of the same benchmark in which the peer shared one of the two settings: how much of the
headline the settings are, until a run gives the peer both."""


def research_partial(files: Files, shown: str) -> list[str]:
    lines = []
    for name in PEER_PARTIAL:
        doc = files.doc(name)
        if doc is None or name == shown:
            continue
        runs, per_round = research_runs(doc)
        ratios = []
        for learn in (False, True):
            on_off = "on" if learn else "off"
            if per_round:
                text = paired_ratios(runs, "ours", "peer", learn, "questions_per_s").text("×")
            else:
                rounds = doc.get("args", {}).get("rounds")
                text = (f"{num(doc['summary'].get(f'speedup_vs_peer/learn={on_off}'))}× (the ratio of the medians "
                        f"of {rounds} rounds; per-round values not kept)")
            ratios.append(f"learning {on_off} {text}")
        same = [what for key, (what, _, _) in PEER_SETTINGS.items() if str(doc.get("args", {}).get(key)) == "same"]
        lines.append(f"- the peer with ours' {' and '.join(same) or 'nothing'}, earlier code: {'; '.join(ratios)} "
                     f"({files.link(name)}, no provenance recorded)")
    return (["", "Earlier runs with the peer sharing one of the two settings:", *lines]) if lines else []


def cost_text(runs: list[dict[str, Any]]) -> str:
    parts = []
    for key, label in (("prompt_tokens_per_question", "prompt tok"),
                       ("completion_tokens_per_question", "completion tok"), ("cpu_s_per_question", "CPU s")):
        values = spread(r.get(key) for r in runs)
        if values.values:
            parts.append(f"{label} {num(values.median)}")
    return ", ".join(parts) or "not recorded"


def legacy_args(args: dict[str, Any]) -> str:
    out = []
    for key in ("systems", "peer_cpu_lora_ops", "peer_cpu_async_scheduling", "questions", "rounds", "out"):
        if key in args:
            value = args[key]
            if key == "systems":
                value = " ".join(str(value).strip("[]").replace("'", "").split(", "))
            out.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(out)


def section_vllm_bench_serve(files: Files) -> list[str]:
    lines = ["## Serving: `vllm bench serve` against our endpoint and `vllm serve`", "",
             "vLLM's own benchmark client (the installed vLLM's `vllm bench serve`: random dataset, `--ignore-eos`, "
             "`/v1/completions`) against our server's raw roles and against `vllm serve` of the same model folder "
             "with the same engine settings, the servers alternated round by round in one run; the ratio is ours / "
             "`vllm serve` per round (for latencies lower is better, for throughputs higher).", ""]
    name = files.pick("vllm_bench_serve", None)
    if name is None:
        return lines + ["No result file yet: `python bench/vllm_bench_serve.py --out bench/results/<file>`.", ""]
    doc = files.doc(name)
    runs = doc.get("runs", [])
    metrics = [("request_throughput", "requests/s"), ("output_throughput", "output tokens/s"),
               ("median_ttft_ms", "TTFT p50, ms"), ("p99_ttft_ms", "TTFT p99, ms"),
               ("median_tpot_ms", "TPOT p50, ms"), ("median_e2el_ms", "end-to-end p50, ms"),
               ("p99_e2el_ms", "end-to-end p99, ms")]
    args = doc.get("args", {})
    for model in dict.fromkeys(r.get("model") for r in runs):
        mine = {r["round"]: r for r in runs if r.get("server") == "mia_engine" and r.get("model") == model}
        theirs = {r["round"]: r for r in runs if r.get("server") == "vllm_serve" and r.get("model") == model}
        lines += [f"Model `{model}`, {args.get('num_prompts')} prompts of {args.get('input_len')} tokens, "
                  f"{args.get('output_len')} out, at most {args.get('max_concurrency')} in flight:", "",
                  "| measure | ours | `vllm serve` | ours / `vllm serve` per round |", "|---|---|---|---|"]
        for key, label in metrics:
            if not any(key in r for r in runs):
                continue
            ratio = spread(mine[i][key] / theirs[i][key] for i in mine
                           if i in theirs and mine[i].get(key) is not None and theirs[i].get(key))
            lines.append(f"| {label} | {spread(r.get(key) for r in mine.values()).text()} | "
                         f"{spread(r.get(key) for r in theirs.values()).text()} | {ratio.text('×', bold=True)} |")
        lines.append("")
    failed = sum(int(r.get("failed", 0) or 0) for r in runs)
    completed = sum(int(r.get("completed", 0) or 0) for r in runs)
    differ = (doc.get("summary") or {}).get("settings_differ") or []
    lines += [f"Requests completed {completed}, failed {failed}. Engine settings that differ: "
              + ("; ".join(differ) if differ else "none (`vllm serve` got our CPU LoRA ops and async scheduling, and "
                 "every engine argument ours passes)") + ".",
              f"Command: `{command_of(doc, '')}`; each call's `vllm bench serve` command and vLLM's own result file "
              f"are in the runs. File: {files.origin(name)}.", ""]
    return lines


def section_serving(files: Files) -> list[str]:
    lines = ["## Serving: latency and bursts against `vllm serve` (`bench_serving.py`)", "",
             "Tiny model, the Planner role (LoRA) on both servers, greedy, 20 sequential requests and a burst "
             "of 32 per round, servers alternated. Ratio: ours / `vllm serve` per round.", ""]
    names = files.with_meta("serving")[-1:] or [n for n in ("serving.json", "serving_run2.json") if files.doc(n)]
    for name in names:
        doc = files.doc(name)
        runs = doc.get("runs") if provenance(doc) else serving_legacy_runs(doc)
        lines += ["| measure | ours | `vllm serve` | ours / vllm per round |", "|---|---|---|---|"]
        for key, label in (("p50_ms", "p50 latency ms"), ("p99_ms", "p99 latency ms"), ("burst_s", "burst of 32, s")):
            mine = [r for r in runs if r["server"] == "mia_engine"]
            theirs = {r["round"]: r for r in runs if r["server"] == "vllm_serve"}
            ratio = spread(r[key] / theirs[r["round"]][key] for r in mine if r["round"] in theirs)
            lines.append(f"| {label} | {spread(r[key] for r in mine).text()} | "
                         f"{spread(r[key] for r in theirs.values()).text()} | {ratio.text('×')} |")
        lines += ["", footer(files, name), ""]
    if not provenance(files.doc(names[-1])) if names else False:
        lines += ["These runs predate the fused CPU LoRA layers and CPU async scheduling.", ""]
    return lines


def serving_legacy_runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round and server from a file before the convention: its latencies in order, ``requests`` a round."""
    per = int(doc.get("args", {}).get("requests", 20))
    runs = []
    for server, s in doc.get("samples", {}).items():
        for index, burst in enumerate(s["burst_s"]):
            lat = sorted(s["lat"][index * per:(index + 1) * per])
            if not lat:
                continue
            runs.append({"server": server, "round": index, "p50_ms": lat[round(0.5 * (len(lat) - 1))] * 1e3,
                         "p99_ms": lat[round(0.99 * (len(lat) - 1))] * 1e3, "burst_s": burst})
    return runs


def section_latency(files: Files) -> list[str]:
    lines = ["## Latency of one question", ""]
    name = files.pick("latency", "latency_v18.json")
    if name:
        doc = files.doc(name)
        rows = doc.get("runs") if provenance(doc) else doc.get("summary", {}).get("rows", [])
        summary = doc.get("summary", {})
        lines += ["One `mia` question with G = 1 over HTTP to the real app in-process, against its recorded LLM and "
                  "tool calls replayed alone (prefix cache reset), tiny model; one run per question (the median of "
                  "its repeats).", "",
                  "| measure, per question | median (min–max, n questions) |", "|---|---|",
                  f"| **overhead** = wall / critical path replayed alone (goal ≤ 1.10) | "
                  f"{spread(r.get('overhead') for r in rows).text(bold=True)} |",
                  f"| in-run: wall / the question's own LLM + tool call time | "
                  f"{spread(r.get('in_run_overhead') for r in rows).text()} |",
                  f"| wall time at the client, s | {spread(r.get('wall_s') for r in rows).text()} |",
                  f"| streamed: time to first event, ms | "
                  f"{spread((r.get('stream_first_event_s') or 0) * 1e3 for r in rows).text()} |", "",
                  f"Repeats per question: {summary.get('repeats')}. {footer(files, name)}", ""]
    eval_rows = []
    for name, what in (("latency_default_alone_v19.json", "one question alone"),
                       ("latency_default_37_v19.json", "37 questions at once")):
        doc = files.doc(name)
        if doc is None:
            continue
        seconds = [p["seconds"] for p in doc.get("passes", {}).get("mia_g1", {}).get("predictions", [])]
        wall = doc.get("passes", {}).get("mia_g1", {}).get("wall_seconds")
        eval_rows.append(f"| {what} | {spread(seconds).text(' s')} | {num(wall)} s | {files.origin(name)} |")
    if eval_rows:
        lines += ["The embedded default (`--config default`), MIA G = 1 on held-out questions through "
                  "`python -m mia_engine eval ... --modes mia_g1` (goals: ≤ 60 s alone, 37 at once ≤ 10 min):", "",
                  "| what | seconds per question: median (min–max, n) | whole pass | file |", "|---|---|---|---|",
                  *eval_rows, ""]
    return lines


def section_scaling(files: Files) -> list[str]:
    lines = ["## Scaling", ""]
    name = files.pick("scaling", "scaling.json", lambda d: len(d.get("summary", {}).get("concurrency", {})) > 1)
    if name:
        doc = files.doc(name)
        conc = doc.get("summary", {}).get("concurrency", {})
        levels = sorted(conc, key=int)
        lines += ["Questions in flight, tiny model, G = 1, one pass per level (n = 1 each).", "",
                  "| in flight | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels),
                  "| questions/s | " + " | ".join(num(conc[k]["questions_per_s"]) for k in levels) + " |",
                  "| p50 / p99 s | " + " | ".join(f"{num(conc[k]['p50_s'])} / {num(conc[k]['p99_s'])}" for k in levels)
                  + " |", "",
                  footer(files, name), ""]
    name = files.pick("scaling", "scaling_memory_default_retrieval_capped.json",
                      lambda d: len(d.get("summary", {}).get("memories", {})) > 1)
    if name:
        doc = files.doc(name)
        memories = doc.get("summary", {}).get("memories", {})
        sizes = sorted(memories, key=int)
        ratios = doc.get("summary", {}).get("memory_ratios") or []
        lines += ["Stored memories, tiny model, 32 in flight, sizes alternated round by round; questions/s per "
                  "size over its rounds, and the largest store over the empty one per round (goal ≥ 0.9).", "",
                  "| stored | " + " | ".join(sizes) + " | largest / empty |", "|---|" + "---|" * (len(sizes) + 1),
                  "| questions/s | " + " | ".join(spread(r["questions_per_s"] for r in memories[size].get("rounds", []))
                                                 .text() for size in sizes)
                  + f" | {spread(ratios).text('×', bold=True)} |", "", footer(files, name), ""]
    return lines


def section_memory_search(files: Files) -> list[str]:
    name = files.pick("memory_search", "memory_search_batching.json")
    if name is None:
        return []
    doc = files.doc(name)
    summary = doc.get("summary", {})
    runs = doc.get("runs") if provenance(doc) else [{"ratio": r} for r in summary.get("ratios", [])]
    return ["## Memory search batching", "",
            f"Two stores of the same {num(summary.get('entries'))} entries sharing one encoder, "
            f"{summary.get('concurrency')} searches at once, alternated round by round.", "",
            "| measure | median (min–max, n rounds) |", "|---|---|",
            f"| batched / one by one, searches/s | {spread(r.get('ratio') for r in runs).text('×', bold=True)} |",
            *([f"| batched searches/s | {spread(r.get('batched_searches_per_s') for r in runs).text()} |",
               f"| one by one searches/s | {spread(r.get('one_by_one_searches_per_s') for r in runs).text()} |"]
              if provenance(doc) else []), "",
            footer(files, name), ""]


def section_ttl(files: Files) -> list[str]:
    name = files.pick("ttl", "ttl.json")
    if name is None:
        return []
    doc = files.doc(name)
    s = doc.get("summary", doc) if provenance(doc) else doc
    runs = doc.get("runs", []) if provenance(doc) else []
    lines = ["## Test-time learning under traffic", "",
             "`planner` requests (8 concurrent, 24 tokens) idle and while GRPO updates are published through "
             "`POST /v1/adapters/planner/grpo`, tiny model.", "",
             "| measure | value |", "|---|---|"]
    if runs:
        ratio = spread(r["p99_ratio"] for r in runs).text("×", bold=True)
        lines += [f"| chat p99 while updating / idle, per round (goal ≤ 1.5×) | {ratio} |"]
    else:
        ratio = f"**{num(s.get('p99_ratio'))}×** (n = 1)"
        lines += [f"| chat p99 while updating / idle, all rounds pooled (goal ≤ 1.5×) | {ratio} |"]
    lines += [f"| publish (step end → new version serving), median / max ms (goal ≤ 50) | "
              f"{num(s.get('swap_ms_median'))} / {num(s.get('swap_ms_max'))} |",
              f"| failed requests; updates published | {s.get('failures')}; "
              f"{s.get('published')} of {s.get('updates')} |", "", footer(files, name), ""]
    return lines


def section_lr_curve(files: Files) -> list[str]:
    name = files.pick("lr_curve", None)
    if name is None:
        return []
    doc = files.doc(name)
    args = doc.get("args", {})
    lines = ["## The learner's learning rate (`bench_lr_curve.py`)", "",
             f"Supervised test-time learning on the embedded default, the first {args.get('questions')} `dev` "
             f"questions of `devset_wiki.jsonl`, G = {args.get('rollouts')}, {args.get('batch_size')} questions per "
             f"update, {args.get('epochs')} epochs, one engine start per learning rate. Per update: the KL between "
             "the Planner versions before and after it on the update's own tokens (k3 estimate, mean per token: "
             "whether the policy moved), the mean reward it trained on, and the gap between the learner's and the "
             "sampling engine's log-probs of the same tokens (how far the learner is from the policy that sampled).",
             "", "| lr | KL per update, median (min–max) | mean reward trained on, per epoch | gap to the sampler, median "
             "(min–max) | accuracy per epoch (learning passes) | updates published |", "|---|---|---|---|---|---|"]
    per_epoch = max(1, int(args.get("questions") or 1) // int(args.get("batch_size") or 1))
    for c in doc.get("summary", []):
        runs = [r for r in doc.get("runs", []) if float(r["lr"]) == float(c["lr"])]
        rewards = [[r["reward_mean"] for r in runs if r["update_index"] // per_epoch == e]
                   for e in range(int(args.get("epochs") or 1))]
        reward = " → ".join(num(sum(e) / len(e), 2) for e in rewards if e)
        lines.append(f"| {c['lr']:g} | {spread(r.get('kl') for r in runs).text()} | {reward} | "
                     f"{spread(r.get('sampler_gap_mean') for r in runs).text()} | "
                     f"{' / '.join(num(a, 2) for a in c['epoch_accuracy'])} | {c['num_published']} of "
                     f"{c['num_updates']} |")
    return lines + ["", footer(files, name), ""]


QUALITY = (("quality_heldout_v21.json", None, "50 held out (`devset_wiki.jsonl`, `heldout`)"),
           ("quality_popular_v21.json", None, "32 popular subjects (`devset_popularity.jsonl`, `popular`)"),
           ("quality_longtail_v21.json", None, "32 long-tail subjects (same file, `longtail`)"),
           ("quality_yesno_heldout_v21.json", None, "12 yes/no (`devset_types.jsonl`, `yesno-heldout`)"),
           ("quality_comparison_heldout_v21.json", None, "12 comparisons (same file, `comparison-heldout`)"),
           ("quality_numeric_heldout_v21.json", None, "12 numeric (same file, `numeric-heldout`)"))
"""The eval files shown: (file, the file its ReAct pass comes from where that mode ran separately, what)."""


def matches(doc: dict[str, Any], mode: str) -> dict[str, bool]:
    return {p["id"]: bool(p["is_match"]) for p in doc.get("passes", {}).get(mode, {}).get("predictions", [])}


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test of ``wins`` against ``losses`` (ties dropped)."""
    from math import comb

    n, k = wins + losses, min(wins, losses)
    return 1.0 if n == 0 else min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)


def paired(mine: dict[str, bool], other: dict[str, bool]) -> str:
    common = [q for q in mine if q in other]
    if not common:
        return "–"
    wins = sum(mine[q] and not other[q] for q in common)
    losses = sum(other[q] and not mine[q] for q in common)
    return f"+{wins} −{losses}, p = {num(sign_test(wins, losses), 2)}"


def section_quality(files: Files) -> list[str]:
    lines = ["## Quality", "",
             "Accuracy (the gold answer matches, normalised exact or contains; n = the questions, one pass per mode), "
             "default config (SmolLM2-135M), 16 in flight. Paired, question by question: what MIA G = 1 answers and "
             "the other does not (+), the reverse (−), exact two-sided sign test. Written by `python -m mia_engine "
             "eval --config default --dataset <file> --split <split> --modes bare react mia_g1 --concurrency 16 --out "
             "<file>` (the product's command, under `python bench/stamped.py --`, which adds its provenance). The answer "
             "choice and the grounded judge are the general mechanisms of issue 52 (the model's confidence, "
             "IDF-weighted character n-grams), calibrated on the dev splits only (`python bench/calibrate_choice.py "
             "--config default`: [`calibrate_choice_dev_v21.json`](results/calibrate_choice_dev_v21.json)); none of "
             "these splits was tuned on. Contains "
             "match is lenient on yes/no and comparison questions (an answer naming both alternatives, or \"No, "
             "...\" restating a false premise, matches).", "",
             "| questions | bare | ReAct | **MIA G = 1** | MIA vs bare | MIA vs ReAct | file |",
             "|---|---|---|---|---|---|---|"]
    for name, react_from, what in QUALITY:
        doc = files.doc(name)
        if doc is None:
            continue
        react_doc = files.doc(react_from) if react_from else doc
        acc = {**doc.get("accuracy", {}), "react": (react_doc or {}).get("accuracy", {}).get("react")}
        mia = matches(doc, "mia_g1")
        cell = lambda m: "–" if acc.get(m) is None else num(acc[m], 2)  # noqa: E731
        origin = files.origin(name) + (f"; ReAct: {files.link(react_from)}" if react_from and react_doc else "")
        lines.append(f"| {what} | {cell('bare')} | {cell('react')} | **{cell('mia_g1')}** | "
                     f"{paired(mia, matches(doc, 'bare'))} | {paired(mia, matches(react_doc or {}, 'react'))} | "
                     f"{origin} |")
    return lines + [""]


def every_pass(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pass of an eval file, each seed's: ``passes`` (a baseline's dict, a TTL variant's list) and
    ``other_passes``."""
    found: list[dict[str, Any]] = []
    for value in doc.get("passes", {}).values():
        found.extend(value if isinstance(value, list) else [value])
    return found + list(doc.get("other_passes", []))


def section_ttl_eval(files: Files) -> list[str]:
    """The latest ``eval`` file with a test-time-learning mode, as one paragraph under the quality table."""
    name = files.pick("eval", None, lambda d: any(str(m).startswith("ttl_") for m in d.get("modes", [])))
    if name is None:
        return []
    doc = files.doc(name)
    passes = every_pass(doc)

    def rate(entry: dict[str, Any]) -> str:
        return spread((entry.get("match") or {}).get("per_seed", [])).text()

    epochs: dict[Any, list[str]] = {}
    for entry in doc.get("summary", {}).values():
        if entry["is_learning"]:
            runs = sorted((p for p in passes if p.get("is_learning") and (p.get("mode"), p.get("epoch")) ==
                           (entry["mode"], entry["epoch"])), key=lambda p: p.get("seed", 0))
            published = " / ".join(str(p.get("num_updates", 0)) for p in runs)
            epochs.setdefault(entry["epoch"], []).append(
                f"explore {rate(entry)} (versions published per seed: {published})")
        else:
            epochs.setdefault(entry["epoch"], []).append(f"{entry['split']} {rate(entry)}")
    steps = "; ".join(("Before learning" if epoch is None else f"epoch {epoch}") + ": " + ", ".join(parts)
                      for epoch, parts in epochs.items())
    modes = ", ".join(m for m in doc.get("modes", []) if m.startswith("ttl_"))
    return [f"**Test-time learning, as `eval` measures it** ({modes}, learned split `{doc.get('split')}`, never "
            f"learned `{doc.get('ttl_eval_split')}`, {doc.get('num_questions')} questions each, {doc.get('seeds')} "
            "seeds, match, median (min–max) over the seeds): each epoch a learning pass over the learned split with "
            f"its gold answers (G = {doc.get('ttl_rollouts')}; *explore* is what the "
            "loop returns while it learns, as the paper reports it, Alg. 3), then G = 1 passes on both splits. "
            f"{steps}.", "", footer(files, name), ""]


AB = (("ab_lora_fused_tiny.json", "`cpu_lora_ops = \"grouped\"`: the fused layer (B), per-slice grouped ops (A)"),
      ("ab_lora_stacked_pinned.json", "adapters stacked once (B) against unstacked (A)"),
      ("ab_cpu_async_scheduling.json", "`cpu_async_scheduling` on (B) against off (A)"),
      ("ab_zero_lora_skip.json", "embedding's and LM head's LoRA skipped while empty (B) against not (A)"),
      ("ab_cpu_placement.json", "`cpu_keep_off_model_cores` on (B) against off (A)"),
      ("ab_block32.json", "KV block size 32 (B) against vLLM's 128 (A)"),
      ("ab_block64.json", "KV block size 64 (B) against 128 (A)"),
      ("ab_cpu_rms_norm.json", "vLLM's C++ RMS norms on CPU (B, not adopted) against ours (A)"))


def section_engine_settings(files: Files) -> list[str]:
    lines = ["## Engine settings on CPU", "",
             "`bench_ab.py`: two source trees alternated A B B A, each start a fresh process, one warm-up pass "
             "then timed passes of 32 questions at G = 4, tiny model, learning off; every pass a run. "
             "Command: `python bench/bench_ab.py <tree A> <tree B> --starts 4 --passes 3 --out bench/results/<file>`.",
             "", "| setting | A q/s | B q/s | B / A (medians) | file |", "|---|---|---|---|---|"]
    entries = [(name, what) for name, what in AB if files.doc(name) is not None]
    entries += [(name, files.doc(name).get("args", {}).get("label") or name) for name in files.with_meta("ab")]
    for name, what in entries:
        doc = files.doc(name)
        if provenance(doc):
            a = spread(r["questions_per_s"] for r in doc["runs"] if r.get("tree") == "A")
            b = spread(r["questions_per_s"] for r in doc["runs"] if r.get("tree") == "B")
        else:
            rates = doc.get("summary", {}).get("q_per_s", {})
            a, b = spread(rates.get("A", [])), spread(rates.get("B", []))
        ratio = b.median / a.median if a.values and b.values else None
        lines.append(f"| {what} | {a.text()} | {b.text()} | **{num(ratio)}×** | {files.origin(name)} |")
    name = files.pick("cpu_lora", "cpu_lora_layers.json",
                      lambda d: any("vllm_over_fused" in r for r in d.get("runs", [])))
    if name:
        doc = files.doc(name)
        rows = doc.get("runs") if provenance(doc) else doc.get("rows", [])
        lines += ["", "One LoRA layer, vLLM's ops / the fused layer, per shape and token count: "
                  f"{spread(r.get('vllm_over_fused') for r in rows).text('×')}. {footer(files, name)}"]
    return lines + [""]


def section_grammar(files: Files) -> list[str]:
    lines = ["## Structured-output grammar compile time", "",
             "The widest schema of each family the server accepts, at a quarter, half and all of its budget, compiled "
             "as vLLM's xgrammar backend compiles a request (validation, then the compile); the slowest compile per "
             "vocabulary (goal ≤ 1 s), over every schema of the run.", "",
             "| vocabulary | tokens | slowest compile s | schemas (n) | timeouts | file |", "|---|---|---|---|---|---|"]
    names = files.with_meta("grammar_compile")[-1:] or ["grammar_compile_lengths.json",
                                                         "grammar_compile_lengths_152000.json"]
    commands = []
    for name in names:
        doc = files.doc(name)
        if doc is None:
            continue
        for run in doc.get("runs", []):
            timed = [r.get("seconds") for r in run.get("rows", []) if r.get("seconds") is not None]
            lines.append(f"| {run.get('vocab')} | {num(run.get('vocab_size'))} | **{num(run.get('max_seconds'))}** | "
                         f"{len(timed)} | {run.get('timeouts')} | {files.origin(name)} |")
        commands.append(f"`{command_of(doc, LEGACY_COMMANDS.get(name, ''))}`")
    return lines + ["", "Command: " + "; ".join(dict.fromkeys(commands)) + ".", ""]


SOAK_PROCESSES = (("VLLM::EngineCore", "engine core"), ("VLLM::Worker", "model worker"),
                  ("mia-learner", "learner process"), ("python", "serving process"))
"""The soak's processes by name prefix, as the table's columns (the idle launcher, flat at 0, left out)."""


def section_soak(files: Files) -> list[str]:
    legacy = "soak_60min_smollm2_bf16_keep_pages.json"
    names = [*([legacy] if files.doc(legacy) is not None else []), *files.with_meta("soak")]
    if not names:
        return []
    spans = ("after_warmup", "second_half", "last_third")
    lines = ["## Soak", "",
             "Mixed traffic against the real server (`bench/soak.py`): raw chat, `mia` with `learn: true`, memory "
             "searches. RSS least-squares slopes per process, MB/min, after warm-up / second half / last third (goal "
             "≤ 0.2 after warm-up); in parentheses, where recorded, the same for the anonymous part of RSS (`RssAnon`: "
             "heaps and tensors, not library pages read in); after *floor*, where recorded, the same for the "
             "process's floor (its lowest RSS in each 5-minute window: what it holds between bursts such as "
             "learner steps, whose working memory comes and goes); every soak run (n = 1 each).", "",
             "| soak | " + " | ".join(label for _, label in SOAK_PROCESSES) + " |",
             "|---|" + "---|" * len(SOAK_PROCESSES)]
    for name in names:
        s = files.doc(name).get("summary", {})
        slopes, anon = s.get("rss_slope_mb_per_min", {}), s.get("anon_slope_mb_per_min", {})
        floor = s.get("floor_slope_mb_per_min", {})
        requests = s.get("requests", {})
        label = (f"`{s.get('config')}`, {num(s.get('minutes'))} min, {sum(requests.values())} requests, "
                 f"**{s.get('num_errors')} errors**, {s.get('adapter_versions_published')} adapters published, "
                 f"healthy: {s.get('healthy_at_end')}")
        moving = {p for span in slopes.values() for p in span
                  if any(abs(slopes[k].get(p) or 0) >= 0.0005 for k in slopes)}  # not the idle launcher
        cells = []
        for prefix, _ in SOAK_PROCESSES:
            process = next((p for p in sorted(moving) if p.startswith(prefix)), None)
            if process is None:
                cells.append("")
                continue
            cell = " / ".join(num(slopes.get(span, {}).get(process)) for span in spans)
            if process in anon.get("after_warmup", {}):
                cell += " (" + " / ".join(num(anon.get(span, {}).get(process)) for span in spans) + ")"
            if process in floor.get("after_warmup", {}):
                cell += "; floor " + " / ".join(num(floor.get(span, {}).get(process)) for span in spans)
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + ["", " ".join(footer(files, name) for name in names), ""]


def section_first_start(files: Files) -> list[str]:
    name = files.pick("first_start", "first_start_warmup.json")
    if name is None:
        return []
    doc = files.doc(name)
    s = doc.get("summary", doc) if provenance(doc) else doc
    runs = doc.get("runs") if provenance(doc) else [s]
    return ["## First start", "",
            f"`python -m mia_engine serve --config {s.get('config')}` on empty caches (model converted, corpus encoded "
            "and indexed, engine warmed up) and again with the caches kept, to `/health` 200.", "",
            "| measure | seconds | goal |", "|---|---|---|",
            f"| first start | {spread(r.get('first_start_s') for r in runs).text(bold=True)} | ≤ 240 |",
            f"| restart | {spread(r.get('restart_s') for r in runs).text(bold=True)} | < 90 |", "",
            footer(files, name), ""]


def section_micro(files: Files) -> list[str]:
    lines = ["## Micro-benchmarks (pytest-benchmark)", "",
             "Memory score (the CPU path and the torch reference), memory search, the learner's GRPO step on the tiny "
             "model and the grammar cost estimate, each timed by `pytest-benchmark` over its rounds "
             "(`bench/micro/`). Run and compare with the stored baseline:", "",
             "    python -m pytest bench/micro --benchmark-only --benchmark-storage=bench/results/micro "
             "--benchmark-autosave",
             "    python -m pytest bench/micro --benchmark-only --benchmark-storage=bench/results/micro "
             "--benchmark-compare --benchmark-compare-fail=median:25%",
             "    pytest-benchmark --storage bench/results/micro compare", ""]
    saved = sorted((p for p in (files.root / "micro").rglob("*.json")), key=lambda p: p.name) \
        if (files.root / "micro").is_dir() else []
    if not saved:
        return lines + ["No saved run yet.", ""]
    name = files.rel(saved[-1])
    doc = files.doc(name)
    lines += ["| benchmark | median (min–max, n rounds) |", "|---|---|"]
    for bench in doc.get("benchmarks", []):
        stats = bench.get("stats", {})
        scale, unit = (1e3, " ms") if stats.get("median", 0) < 1 else (1.0, " s")
        cell = f"{num(stats.get('median', 0) * scale)}{unit} ({num(stats.get('min', 0) * scale)}–" \
               f"{num(stats.get('max', 0) * scale)}, n = {stats.get('rounds')})"
        lines.append(f"| `{bench.get('name')}` | {cell} |")
    return lines + ["", f"File: {files.origin(name)}.", ""]


def section_gpu(files: Files) -> list[str]:
    folders = sorted(p for p in files.root.glob("gpu_*") if p.is_dir())
    if not folders:
        return []
    lines = ["## GPU runs", "",
             "Text output of `bench/gpu_session.sh` on lent GPUs (no vLLM there: the memory kernel, the GRPO step and "
             "the doctor's checks). Not parsed into figures here; what they show is in `bench/history/`.", "",
             "| folder | machine | files |", "|---|---|---|"]
    for folder in folders:
        machine_txt = folder / "machine.txt"
        first = machine_txt.read_text(errors="replace").strip().splitlines()[:1] if machine_txt.exists() else []
        gpu = next((line for line in (machine_txt.read_text(errors="replace").splitlines() if machine_txt.exists()
                                      else []) if "NVIDIA" in line), first[0] if first else "not recorded")
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
        lines.append(f"| `{folder.name}/` | {gpu.strip()[:80]} | {', '.join(names)} |")
    return lines + [""]


CLAIMED = {"lr_curve", "research", "vllm_bench_serve", "serving", "latency", "scaling", "memory_search", "ttl", "ab", "cpu_lora",
           "eval", "grammar_compile", "soak", "first_start", "micro"}


def section_other(files: Files) -> list[str]:
    """Files with provenance that no section above shows: the latest of each benchmark, generically."""
    latest: dict[str, str] = {}
    for name in files.all_json():
        meta = provenance(files.doc(name))
        if meta and meta.get("benchmark") not in CLAIMED:
            latest[meta["benchmark"]] = name
    lines = []
    for benchmark, name in sorted(latest.items()):
        doc = files.doc(name)
        lines += [f"### {benchmark}", "", *generic_table(doc.get("runs", [])), "",
                  f"Command: `{command_of(doc, '')}`. File: {files.origin(name)}.", ""]
    return (["## Other benchmarks", ""] + lines) if lines else []


SECTIONS: list[Section] = [section_research, section_vllm_bench_serve, section_serving, section_latency,
                           section_scaling, section_memory_search, section_ttl, section_lr_curve, section_quality,
                           section_ttl_eval,
                           section_engine_settings, section_grammar, section_soak, section_first_start, section_micro,
                           section_gpu, section_other]

HEADER = """# Benchmark results

Generated by `python bench/make_results.py` from the result files under `bench/results/`: do not edit by hand (`python bench/make_results.py --check`
fails when this page is not what the files give). Each figure is the median over the runs its file kept, with min–max and n (every run counts, none is
left out); each section names its command, and each file its machine, commit, versions, date and load from its `meta` block (`bench/results_io.py`). A
file written before that convention says "no provenance recorded" and the machine the hand-written page named for it.

Ratios compare systems measured in the same run, alternated round by round: the machines are shared VMs (a load above the cores at a run's start is
flagged), so compare absolute figures only within one file. Models: *tiny* = `configs/tiny.toml` (random 2-layer Qwen3: nonsense text, real
mechanics); *default* = `configs/default.toml` (SmolLM2-135M-Instruct). How the figures were reached, superseded runs and the investigations (soak,
allocators, GPU sessions): `bench/history/` (`HISTORY.md`, and `RESULTS-2026-11.md`, this page as it was written by hand until 2026-11-29).

A new run: the benchmark with `--out bench/results/<file>.json` (or, for the micro-benchmarks, the pytest-benchmark command below), then `python
bench/make_results.py`; of each benchmark the latest file
with a `meta` block replaces the older figure here.
"""


def render(root: Path = RESULTS) -> str:
    files = Files(root)
    lines = HEADER.splitlines() + [""]
    for section in SECTIONS:
        lines += section(files)
    rest = [n for n in files.all_json() if n not in files.shown]
    lines += ["## Not shown", "",
              f"{len(rest)} more result files under `bench/results/` (earlier runs, superseded settings, the "
              "investigations' raw data): their story is in `bench/history/`."]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what would be written")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the result files' folder")
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    text = render(args.results)
    count = text.count("\n")
    if count > MAX_LINES:
        print(f"the page would have {count} lines, more than {MAX_LINES}", file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(args.out), "generated",
                                        lineterm="")
            print("\n".join(list(diff)[:60]), file=sys.stderr)
            print(f"{args.out} is not current: run python bench/make_results.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out} ({count} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
