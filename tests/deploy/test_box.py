"""What ``serve`` and ``--dry-run`` read from a GPU box through NVML before any engine starts (a fake NVML on
the CPU): a box with fewer GPUs than the config names, a GPU with too little free memory, a compute
capability below bfloat16's and a driver older than torch's CUDA are refused with the per-GPU table; a
fitting box passes, planned with its own memory; without NVML nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mia_engine.config import load_config
from mia_engine.deploy import cuda_driver, gpu_probe
from mia_engine.deploy.budget import GIB, plan
from mia_engine.models.lora import init_adapter
from mia_engine.preflight import dry_run, preflight
from tests.deploy.fake_nvml import H100, FakeNvml, shim

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG = str(Path(__file__).parents[2] / "configs" / "8xgpu.toml")
MODELS = {"engines.qwen3-8b.model": str(FIXTURES / "qwen3-8b"),
          "engines.qwen2_5-vl-7b.model": str(FIXTURES / "qwen2_5-vl-7b"),
          "engines.qwen3-32b.model": str(FIXTURES / "qwen3-32b")}
ERROR = "python -m mia_engine: error: "


@pytest.fixture(scope="module")
def planner_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_adapter(FIXTURES / "qwen3-8b", tmp_path_factory.mktemp("adapter") / "planner", rank=8)


def _box(num_gpus: int = 8, **changed: dict) -> list[dict]:
    """``num_gpus`` idle H100s; ``changed`` maps ``"gpu<i>"`` to what differs on that GPU."""
    return [{**H100, **changed.get(f"gpu{i}", {})} for i in range(num_gpus)]


def _on_fake_box(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml | None, cuda: str | None = "13.0") -> None:
    monkeypatch.setattr(gpu_probe, "nvml_module", lambda: nvml)
    monkeypatch.setattr(cuda_driver, "torch_cuda", lambda: cuda)


def _dry_run(adapter: Path, capsys: pytest.CaptureFixture, **overrides: object) -> tuple[int, str, list[str]]:
    config = load_config(CONFIG, {**MODELS, "roles.planner.adapter": str(adapter), **overrides})
    code = dry_run(config)
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def _cli(adapter: Path, tmp_path: Path, box: dict, *flags: str) -> subprocess.CompletedProcess:
    """``python -m mia_engine serve --config 8xgpu`` with ``flags`` on a fake box: NVML is the fake's
    (``pynvml`` first on PYTHONPATH)."""
    paths = [str(shim(tmp_path / "nvml")), str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "FAKE_NVML": json.dumps(box), "PYTHONPATH": os.pathsep.join(p for p in paths if p),
           "MIA_API_KEY": "api-key-of-16-chars", "MIA_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "mia_engine", "serve", "--config", CONFIG,
               *(f"--{k}={v}" for k, v in MODELS.items()), f"--roles.planner.adapter={adapter}", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)


def test_the_probe_reads_each_gpu_in_cudas_numbering() -> None:
    nvml = FakeNvml([{**H100, "name": f"GPU{i}", "uuid": f"GPU-{i}"} for i in range(4)], driver="580.95.05")
    box = _probe(nvml, {})
    assert box.driver == "580.95.05" and [g.name for g in box.gpus] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    gpu = box.gpus[0]
    assert (gpu.index, gpu.total_bytes, gpu.free_bytes, gpu.compute_capability) == (
        0, int(H100["total_gib"] * GIB), int(H100["free_gib"] * GIB), (9, 0))
    visible = _probe(nvml, {"CUDA_VISIBLE_DEVICES": "3,GPU-1,x,0"})  # CUDA stops at the first bad entry
    assert [(g.index, g.name) for g in visible.gpus] == [(0, "GPU3"), (1, "GPU1")]
    assert _probe(nvml, {"CUDA_VISIBLE_DEVICES": ""}).gpus == []
    assert nvml.num_open == 0  # every nvmlInit was shut down
    assert _probe(FakeNvml([], is_loaded=False), {}) is None  # no driver loaded


def _probe(nvml: FakeNvml, environ: dict[str, str]) -> gpu_probe.Box | None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(gpu_probe, "nvml_module", lambda: nvml)
        return gpu_probe.probe_box(environ)


def test_a_fitting_box_passes_planned_with_its_own_memory(planner_adapter: Path, tmp_path: Path) -> None:
    done = _cli(planner_adapter, tmp_path, {"gpus": _box()}, "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "8 GPU budget(s) of 79.65 GiB (this box's smallest GPU, read through NVML)" in done.stdout
    table = done.stdout.split("This box (NVML): ")[1].split("\n\n")[0].splitlines()
    assert table[0] == "8 GPU(s); torch without CUDA; NVIDIA driver 580.95.05"  # this machine's torch is a CPU build
    assert table[2].split() == ["0", "NVIDIA", "H100", "80GB", "HBM3", "79.10/79.65", "71.68", "9.0", "ok"]
    assert table[9].split()[-3:] == ["31.73", "9.0", "ok"]  # the learner process has a CUDA context of its own


def test_a_box_with_fewer_gpus_than_the_config_names_refuses(planner_adapter: Path, tmp_path: Path) -> None:
    done = _cli(planner_adapter, tmp_path, {"gpus": _box(4)}, "--dry-run")
    assert done.returncode == 2, done.stderr[-3000:]
    *table, error = done.stderr.strip().splitlines()
    assert error == (f"{ERROR}engines.qwen2_5-vl-7b.devices: GPU 4 is not on this box, which has 4 GPU(s) (engine "
                     "qwen2_5-vl-7b replica 2/2) (and 3 more: see the table)")
    assert table[0].startswith("This box (NVML): 4 GPU(s);")
    assert [row.split()[0] for row in table[2:]] == [str(i) for i in range(8)]
    assert all(row.endswith("not on this box") for row in table[6:])


def test_serve_refuses_a_gpu_with_too_little_free_memory_before_starting(planner_adapter: Path,
                                                                          tmp_path: Path) -> None:
    """Another process holds 50 GiB of GPU 2: vLLM would refuse to start there, after the other engines loaded."""
    box = {"gpus": _box(gpu2={"free_gib": H100["total_gib"] - 50})}
    done = _cli(planner_adapter, tmp_path, box, f"--data-dir={tmp_path / 'data'}")
    assert done.returncode == 2, done.stderr[-3000:]
    *table, error = done.stderr.strip().splitlines()
    assert error == (f"{ERROR}engines.qwen3-8b.gpu_memory_utilization: GPU 2 (NVIDIA H100 80GB HBM3) has 29.65 GiB "
                     "free of 79.65 GiB, the config needs 71.68 GiB there (engine qwen3-8b replica 3/3)")
    row = next(line for line in table if line.split()[0] == "2")
    assert row.split()[-7:] == ["29.65/79.65", "71.68", "9.0", "short", "by", "42.04", "GiB"]
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_bfloat16_on_a_gpu_below_compute_capability_8_refuses(planner_adapter: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    """A Turing box (Quadro RTX 8000, 48 GB, compute capability 7.5): the config's explicit bfloat16 cannot run."""
    turing = {"name": "Quadro RTX 8000", "total_gib": 45.0, "free_gib": 44.5, "cc": [7, 5]}
    _on_fake_box(monkeypatch, FakeNvml([turing] * 8))
    code, _, lines = _dry_run(planner_adapter, capsys)
    assert code == 2
    assert lines[-1] == (f"{ERROR}engines.qwen3-8b.dtype: bfloat16 needs compute capability >= 8.0, GPU 0 (Quadro RTX "
                         "8000) has 7.5: use float16 there (and 7 more: see the table)")
    assert lines[-2].endswith("7.5  bfloat16 needs cc >= 8.0 (learner.dtype)")  # GPU 7's row
    float16 = {f"engines.{name}.dtype": "float16" for name in ("qwen3-8b", "qwen2_5-vl-7b", "qwen3-32b")}
    code, out, lines = _dry_run(planner_adapter, capsys, **float16, **{"learner.dtype": "float16"})
    assert code == 0, lines
    assert "8 GPU budget(s) of 45.00 GiB (this box's smallest GPU, read through NVML)" in out


def test_a_driver_older_than_torchs_cuda_refuses_unless_skipped(planner_adapter: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    _on_fake_box(monkeypatch, FakeNvml(_box(), driver="570.86.15"), cuda="13.0")
    config = load_config(CONFIG, {**MODELS, "roles.planner.adapter": str(planner_adapter),
                                  "data_dir": str(tmp_path / "data")})
    assert preflight(config, {"RAY_ADDRESS": ""}) == 2
    *table, error = capsys.readouterr().err.strip().splitlines()
    assert error == (f"{ERROR}NVIDIA driver 570.86.15 is too old for CUDA 13.0, which needs >= 580: update the "
                     "driver (or, with NVIDIA's CUDA forward compatibility package, set MIA_SKIP_DRIVER_CHECK=1)")
    assert table[0].startswith("This box (NVML): 8 GPU(s); torch CUDA 13.0; NVIDIA driver 570.86.15 is too old")
    assert all(row.endswith(" ok") for row in table[2:])  # the GPUs themselves fit
    assert preflight(config, {"MIA_SKIP_DRIVER_CHECK": "1"}) == 0
    _on_fake_box(monkeypatch, FakeNvml(_box(), driver="580.95.05"), cuda="13.0")
    assert preflight(config, {}) == 0


def test_without_nvml_the_config_figures_stand(planner_adapter: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    expected = plan(load_config(CONFIG, {**MODELS, "roles.planner.adapter": str(planner_adapter)}), Path)
    for nvml in (None, FakeNvml([], is_loaded=False)):  # no pynvml; pynvml without a driver
        _on_fake_box(monkeypatch, nvml)
        code, out, err = _dry_run(planner_adapter, capsys)
        assert (code, err) == (0, [])
        assert "8 GPU budget(s) of 79.2 GiB (from config.json files" in out and "This box" not in out
        assert "NVML did not answer (no NVIDIA driver, or no nvidia-ml-py): planned on gpus.memory_gib = 79.2 GiB" \
            in out
        for gpu in expected.gpus:
            assert f"  GPU {gpu.gpu}: {gpu.used_bytes / GIB:.2f} of 79.20 claimed" in out
