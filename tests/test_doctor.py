"""``python -m mia_engine doctor`` on this CPU machine: the CPU-sized checks run and pass, the GPU-only
ones say they were skipped, and the exit status is 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_doctor_small_on_cpu_runs_the_cpu_parts_and_says_what_it_skipped() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run([sys.executable, "-m", "mia_engine", "doctor", "--small"], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split(":")[0]: line for line in result.stdout.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")}
    assert lines.keys() == {"PASS memory kernel", "PASS GRPO step", "SKIP faiss-gpu"}, result.stdout
    assert "Triton interpreter matches the torch reference" in lines["PASS memory kernel"]
    assert "r64 LoRA" in lines["PASS GRPO step"] and "not measured" in lines["PASS GRPO step"]


def test_doctor_checks_picks_a_subset_and_refuses_an_unknown_one_in_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    command = [sys.executable, "-m", "mia_engine", "doctor", "--small", "--checks"]
    only = subprocess.run([*command, "faiss"], capture_output=True, text=True, timeout=300, env=env)
    assert only.returncode == 0, only.stdout + only.stderr
    assert [line.split(":")[0] for line in only.stdout.splitlines()] == ["SKIP faiss-gpu"]
    bad = subprocess.run([*command, "kernel,gpu"], capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].endswith(
        "unknown check(s) gpu; choose from kernel,grpo,faiss,contention")


def test_contention_runs_searches_under_the_learner_at_cpu_size() -> None:
    """The searches and the learner's steps run in their own bound threads, alone and together."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run([sys.executable, "-m", "mia_engine", "doctor", "--small", "--checks", "contention"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert line.startswith("PASS contention: priority streams: search p50 ") and "learner step " in line
    first, *others = line.split("; priority streams")
    assert "learner in its own process" in first and others and "learner in a thread" in others[0], line


def test_contention_goals() -> None:
    from mia_engine.doctor.contention import Contention, Latencies

    def run(idle: list[float], under: list[float], step_under: float) -> Contention:
        return Contention("priority", Latencies(idle), Latencies(under), Latencies([2.0, 2.0]),
                          Latencies([step_under, step_under]))

    # the goals: p99 <= 1.5x idle, max <= 30 ms, a learner step <= 1.1x its time alone
    assert run([0.003] * 99 + [0.005], [0.004] * 99 + [0.007], 2.1).misses() == []
    missed = run([0.003] * 100, [0.004] * 98 + [0.021, 0.280], 2.6).misses()
    assert [m.split(" ")[1] for m in missed] == ["p99", "max", "step"], missed


def test_doctor_reads_the_learner_section_of_a_config_and_refuses_a_bad_one_in_one_line(
        tmp_path: Path, monkeypatch) -> None:
    """``--config``: the GRPO step's recompute and its utilisation floor come from the config's [learner]."""
    from mia_engine import cli, doctor

    seen = []
    monkeypatch.setattr(doctor, "main", lambda *args: seen.append(args[-1]) or 0)
    tiny = (Path(__file__).parents[1] / "configs" / "tiny.toml").read_text()
    good = tmp_path / "floor.toml"
    good.write_text(tiny.replace("[learner]\n", "[learner]\nmin_model_flops_utilization = 0.4\ncheckpoint_layers = 2\n"))
    assert cli.main(["doctor", "--small", "--checks", "grpo", "--config", str(good)]) == 0
    assert (seen[0].min_model_flops_utilization, seen[0].checkpoint_layers) == (0.4, 2)
    bad = tmp_path / "bad.toml"
    bad.write_text(tiny.replace("[learner]\n", "[learner]\nmin_model_flops_utilization = 2\n"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run([sys.executable, "-m", "mia_engine", "doctor", "--config", str(bad)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "min_model_flops_utilization" in result.stderr
