"""The benchmarks' small helpers whose output goes into bench/RESULTS.md: per-process CPU accounting,
the A/B order, the servers' CPU placement, what the peer's ``vllm serve`` gets of ours, the breakdown
read off the serving metrics. (The benchmarks themselves are run, not tested: their figures are
measurements.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.bench_ab import order
from bench.servers import launch, vllm_engine_args
from bench.stats import cpu_spent, metrics_breakdown, tree_cpu_s
from mia_engine.config import EngineConfig
from mia_engine.server.metrics import Metrics
from mia_engine.engines.cpu.options import ASYNC_SCHEDULING_KEY, LORA_OPS_KEY, MALLOC_KEY


def test_cpu_spent_is_per_process_and_leaves_idle_ones_out() -> None:
    before = {1: ("benchmark[1]", 10.0), 2: ("VLLM::EngineCore[2]", 5.0), 3: ("idle[3]", 1.0)}
    after = {1: ("benchmark[1]", 12.5), 2: ("VLLM::EngineCore[2]", 20.0), 3: ("idle[3]", 1.01),
             4: ("python[4]", 0.7)}  # started during the pass: all its time counts
    assert cpu_spent(before, after) == {"VLLM::EngineCore[2]": 15.0, "benchmark[1]": 2.5, "python[4]": 0.7}
    assert list(cpu_spent(before, after)) == ["VLLM::EngineCore[2]", "benchmark[1]", "python[4]"]  # most first


def test_tree_cpu_s_sees_this_process_and_its_children() -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            snapshot = tree_cpu_s()
            if child.pid in snapshot and snapshot[child.pid][1] >= 0.3:
                break
            time.sleep(0.1)
        assert snapshot[os.getpid()][0] == f"benchmark[{os.getpid()}]"
        assert snapshot[child.pid][1] >= 0.3, snapshot
    finally:
        child.kill()
        child.wait()


def test_ab_starts_alternate_so_a_drift_falls_on_both() -> None:
    assert order(8) == [0, 1, 1, 0, 0, 1, 1, 0]
    assert order(3) == [0, 1, 1]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least two cores")
def test_a_server_starts_on_every_cpu_even_from_a_pinned_benchmark(tmp_path: Path) -> None:
    """Ours moves the benchmark process off its worker's cores; the peer's server started from it
    must not inherit that (a user starts ``vllm serve`` from a shell)."""
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(own)})
    try:
        server = launch("probe", [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                        tmp_path, 0)
        server.process.wait(timeout=60)
    finally:
        os.sched_setaffinity(0, own)
    assert server.log_path.read_text().strip() == str(sorted(own))


@pytest.mark.parametrize(("lora_ops", "async_scheduling"), [(False, False), (True, False), (False, True)])
def test_the_peer_gets_our_engine_choices_only_when_asked(lora_ops: bool, async_scheduling: bool) -> None:
    """The peer's ``vllm serve`` runs as its users get it (vLLM's LoRA ops, no async scheduling on CPU)
    unless the benchmark asks; the allocator is the same for both (vLLM's CPU guide asks for it)."""
    args = vllm_engine_args(EngineConfig(model="m"), same_cpu_lora_ops=lora_ops,
                            same_cpu_async_scheduling=async_scheduling)
    extra = json.loads(args[args.index("--additional-config") + 1])
    assert MALLOC_KEY in extra
    assert (LORA_OPS_KEY in extra) is lora_ops and (ASYNC_SCHEDULING_KEY in extra) is async_scheduling


def test_the_peer_gets_our_kv_block_size_only_when_set() -> None:
    assert "--block-size" not in vllm_engine_args(EngineConfig(model="m"))
    args = vllm_engine_args(EngineConfig(model="m", block_size=64))
    assert args[args.index("--block-size") + 1] == "64"


def test_the_metrics_breakdown_adds_up_what_was_recorded() -> None:
    """The benchmarks read their breakdown from the series ``/metrics`` serves: hit rate = cached / prompt."""
    metrics = Metrics()
    metrics.record_usage("planner", 100, 25, 10, 0)
    metrics.record_usage("planner", 300, 175, 10, 0)
    metrics.record_usage("executor", 50, 0, 5, 1)
    for seconds in (0.5, 1.5):
        metrics.stage_started("plan")
        metrics.stage_finished("plan", seconds)
    breakdown = metrics_breakdown(metrics.registry)
    assert breakdown["prefix_hit_rate"] == {"planner": 200 / 400, "executor": 0.0}
    assert breakdown["prompt_tokens"] == {"planner": 400, "executor": 50}
    assert breakdown["completion_tokens"] == {"planner": 20, "executor": 5}
    assert breakdown["stage_seconds"]["plan"] == pytest.approx(2.0) and breakdown["stage_count"]["plan"] == 2


def test_the_soaks_floor_slope_reads_what_stays_between_bursts() -> None:
    """A learner busy with steps most of the time: 1,000 MB between steps, 2,000 MB during them. The plain
    least-squares slope reads where the bursts fell (here, more of them late in the run); the floor's is 0.
    A process whose floor rises 1 MB a minute reads 1."""
    from bench.soak import floor_slopes, rss_slopes

    samples = []
    for i in range(120):  # 60 minutes, a sample every 30 s
        t_s = i * 30.0
        in_step = (i % 6 != 0) if t_s >= 1800 else (i % 6 in (1, 2))
        samples.append({"t_s": t_s, "rss_by_process_mb": {"mia-learner[2]": 2000.0 if in_step else 1000.0,
                                                          "leaky[3]": 500.0 + t_s / 60}})
    raw, floor = rss_slopes(samples, 3600, 0.2), floor_slopes(samples, 3600, 0.2)
    assert raw["after_warmup"]["mia-learner[2]"] > 5
    assert floor["after_warmup"]["mia-learner[2]"] == 0.0 and floor["second_half"]["mia-learner[2]"] == 0.0
    assert floor["after_warmup"]["leaky[3]"] == pytest.approx(1.0, abs=0.01)


def test_a_stamped_product_command_gets_the_benchmarks_provenance(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    writer = "import json, sys; open(sys.argv[sys.argv.index('--out') + 1], 'w').write(json.dumps({'accuracy': 1}))"
    done = subprocess.run([sys.executable, "bench/stamped.py", "--", "python", "-c", writer, "--out", str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["accuracy"] == 1 and list(doc)[0] == "meta"
    meta = doc["meta"]
    assert meta["command"].startswith("python -c ") and meta["command"].endswith(f"--out {out}")
    assert {"commit", "machine", "versions", "started_utc", "finished_utc"} <= set(meta)
    failed = subprocess.run([sys.executable, "bench/stamped.py", "--", "python", "-c", "raise SystemExit(3)",
                             "--out", str(tmp_path / "none.json")], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 3 and not (tmp_path / "none.json").exists()
