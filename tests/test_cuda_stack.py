"""scripts/cuda_stack.py's ``check`` walks the extra's whole dependency tree: here over a fake metadata
source (a dict of package -> release and requirements, what pip's report says of each), so the walk's
logic runs offline; tests/test_packaging.py reads the real extra from the registry."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.scripts import load_script

cuda_stack = load_script("cuda_stack")

TORCH_CU13 = {
    "torch": ("2.13.0", ["filelock", "cuda-toolkit[cudart,cublas]==13.0.3; platform_system == 'Linux'",
                         "nvidia-nccl-cu13==2.29.7; platform_system == 'Linux'", "optree>=0.13.0; extra == 'optree'"]),
    "filelock": ("4.3.2", []),
    "cuda-toolkit": ("13.0.3.0", ["nvidia-cuda-runtime==13.0.96.*; extra == 'cudart'",
                                  "nvidia-cublas==13.1.1.3.*; extra == 'cublas'",
                                  "nvidia-npp==13.0.1.2.*; extra == 'npp'"]),
    "nvidia-cuda-runtime": ("13.0.96", []),
    "nvidia-cublas": ("13.1.1.3", []),
    "nvidia-nccl-cu13": ("2.29.7", []),
}
CUTLASS = {  # vLLM 0.32's: the base package always requires the cu12 flavor; [cu13] adds the cu13 one
    "nvidia-cutlass-dsl": ("4.8.0", ["nvidia-cutlass-dsl-libs-base==4.8.0", "nvidia-cutlass-dsl-libs-cu12==4.8.0",
                                     "nvidia-cutlass-dsl-libs-cu13==4.8.0; extra == 'cu13'"]),
    "nvidia-cutlass-dsl-libs-base": ("4.8.0", ["cuda-bindings>=12.8", "backports.strenum; python_version < '3.11'"]),
    "nvidia-cutlass-dsl-libs-cu12": ("4.8.0", ["cuda-bindings>=12.8"]),
    "nvidia-cutlass-dsl-libs-cu13": ("4.8.0", ["cuda-bindings>=12.8"]),
    "cuda-bindings": ("13.4.4", []),
}


class FakeRegistry:
    """A metadata source over ``{name: (release, requirements)}`` that records what each call asked."""

    def __init__(self, packages: dict[str, tuple[str, list[str]]]) -> None:
        self.packages = packages
        self.calls: list[list[str]] = []

    def __call__(self, requirements: list[str]) -> dict[str, dict]:
        self.calls.append(list(requirements))
        items = {}
        for requirement in requirements:
            name = canonicalize_name(Requirement(requirement).name)
            version, requires_dist = self.packages[name]
            items[name] = {"metadata": {"name": name, "version": version, "requires_dist": requires_dist}}
        return items

    def num_reads(self, name: str) -> int:
        return sum(canonicalize_name(Requirement(r).name) == name for call in self.calls for r in call)


def run_check(roots: list[str], packages: dict[str, tuple[str, list[str]]]) -> tuple[bool, str]:
    return cuda_stack.check(cuda_stack.walk(roots, FakeRegistry(packages)))


def test_a_cu12_package_three_levels_down_fails_the_check_with_its_path() -> None:
    """What the one-level check missed: vLLM -> a kernel package -> its CUDA 12 libraries."""
    packages = {**TORCH_CU13, "vllm": ("0.32.0", ["torch==2.13.0", "some-kernels==1.0"]),
                "some-kernels": ("1.0", ["some-kernels-libs-cu12==1.0"]), "some-kernels-libs-cu12": ("1.0", [])}
    is_ok, text = run_check(["vllm==0.32.0", "faiss-cpu>=1.8"], {**packages, "faiss-cpu": ("1.15.1", [])})
    verdict, *lines = text.splitlines()
    assert not is_ok and verdict == "2 CUDA majors in one process (CUDA 12, CUDA 13)", text
    assert "  CUDA 12  some-kernels-libs-cu12 1.0  vllm -> some-kernels -> some-kernels-libs-cu12" in lines
    assert ("  CUDA 13  nvidia-cuda-runtime 13.0.96  vllm -> torch -> cuda-toolkit -> nvidia-cuda-runtime"
            in lines)
    assert run_check(["vllm==0.32.0"], {**packages, "some-kernels": ("1.0", [])})[0]


def test_cutlass_cu12_flavor_beside_its_cu13_flavor_is_listed_but_not_counted() -> None:
    packages = {**TORCH_CU13, **CUTLASS}
    is_ok, text = run_check(["torch==2.13.0", "nvidia-cutlass-dsl[cu13]==4.8.0"], packages)
    assert is_ok, text
    assert text.splitlines()[0] == f"one CUDA major (CUDA 13) over {len(packages)} packages"
    assert ("  CUDA 12  nvidia-cutlass-dsl-libs-cu12 4.8.0  nvidia-cutlass-dsl -> nvidia-cutlass-dsl-libs-cu12  "
            "(installed, not loaded: the importer loads nvidia-cutlass-dsl-libs-cu13)") in text.splitlines()
    is_ok, text = run_check(["torch==2.13.0", "nvidia-cutlass-dsl==4.8.0"], packages)  # no cu13 flavor
    assert not is_ok and "nvidia-cutlass-dsl -> nvidia-cutlass-dsl-libs-cu12\n" in text + "\n", text


def test_extras_and_markers_are_evaluated_for_a_linux_gpu_box_on_python_3_11() -> None:
    registry = FakeRegistry({**TORCH_CU13, **CUTLASS, "win-only": ("1", []), "optree": ("0.13", [])})
    tree = cuda_stack.walk(["torch==2.13.0", "nvidia-cutlass-dsl==4.8.0", "win-only; sys_platform == 'win32'"],
                           registry)
    assert "win-only" not in tree and "optree" not in tree and "nvidia-npp" not in tree
    assert "backports-strenum" not in tree  # python_version < '3.11'
    assert {"nvidia-cuda-runtime", "nvidia-cublas", "nvidia-nccl-cu13"} <= tree.keys()  # Linux, torch's extras
    assert "nvidia-cutlass-dsl-libs-cu13" not in tree  # nobody asked for [cu13]


def test_a_later_path_asking_for_an_extra_walks_its_requirements_without_reading_the_package_again() -> None:
    packages = {**CUTLASS, "vllm": ("0.32.0", ["nvidia-cutlass-dsl==4.8.0", "quack==0.6"]),
                "quack": ("0.6", ["nvidia-cutlass-dsl[cu13]>=4.7"])}
    registry = FakeRegistry(packages)
    tree = cuda_stack.walk(["vllm==0.32.0"], registry)
    assert tree["nvidia-cutlass-dsl-libs-cu13"].path == ("vllm", "quack", "nvidia-cutlass-dsl",
                                                          "nvidia-cutlass-dsl-libs-cu13")
    assert tree["nvidia-cutlass-dsl"].path == ("vllm", "nvidia-cutlass-dsl")  # the first path found
    assert registry.num_reads("nvidia-cutlass-dsl") == 1 and registry.num_reads("cuda-bindings") == 1


def test_each_package_is_read_once_per_walk_with_its_level_specifiers_merged() -> None:
    packages = {"a": ("1", ["c>=1", "d>=2"]), "b": ("1", ["a", "d<3"]), "c": ("1.5", ["d!=2.4"]), "d": ("2.5", [])}
    registry = FakeRegistry(packages)
    tree = cuda_stack.walk(["a", "b"], registry)  # a cycle (b -> a) and a diamond (a, b, c -> d)
    assert sorted(tree) == ["a", "b", "c", "d"]
    assert registry.calls == [["a", "b"], ["c>=1", "d<3,>=2"]]
    assert tree["d"].path == ("a", "d") and sorted(tree["d"].requirements) == ["d!=2.4", "d<3", "d>=2"]


def test_cuda_versioned_packages_carry_the_major_of_their_pin_else_of_the_release_read() -> None:
    packages = {**TORCH_CU13, "flashinfer": ("0.7", ["cuda-python>=12.0", "nvidia-cuda-runtime"]),
                "cuda-python": ("12.9.0", [])}
    is_ok, text = run_check(["torch==2.13.0", "flashinfer==0.7"], packages)
    assert not is_ok and "  CUDA 12  cuda-python 12.9.0  flashinfer -> cuda-python" in text.splitlines(), text
    assert "  CUDA 13  nvidia-cuda-runtime 13.0.96  flashinfer -> nvidia-cuda-runtime" in text.splitlines()
    assert run_check(["torch==2.13.0", "flashinfer==0.7"], {**packages, "cuda-python": ("13.4.4", [])})[0]


def test_a_local_build_or_no_cuda_at_all_fails_the_check() -> None:
    is_ok, text = run_check(["torch==2.13.0"], {**TORCH_CU13, "torch": ("2.13.0+cpu", ["filelock"])})
    assert not is_ok and text == "a local build, not a registry release, was read: torch 2.13.0+cpu"
    is_ok, text = run_check(["faiss-cpu>=1.8"], {"faiss-cpu": ("1.15.1", ["numpy"]), "numpy": ("2.3.5", [])})
    assert not is_ok and text == "no CUDA package found: the extra brings no CUDA runtime"


def test_an_exact_pin_that_picked_a_local_build_is_read_again_as_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch==2.13.0`` matches ``2.13.0+cpu`` on an extra index; ``===`` only where that happened, since
    ``cuda-toolkit===13.0.3`` misses the registry's ``13.0.3.0``."""
    asked: list[list[str]] = []

    def registry_metadata(requirements: list[str]) -> dict[str, dict]:
        asked.append(requirements)
        local = {"torch==2.13.0": "2.13.0+cpu", "cuda-toolkit==13.0.3": "13.0.3.0"}
        return {Requirement(r).name: {"metadata": {"name": Requirement(r).name,
                                                   "version": local.get(r, r.partition("===")[2])}}
                for r in requirements}

    monkeypatch.setattr(cuda_stack, "registry_metadata", registry_metadata)
    items = cuda_stack.registry_source(["torch==2.13.0", "cuda-toolkit==13.0.3", "filelock"])
    assert asked == [["torch==2.13.0", "cuda-toolkit==13.0.3", "filelock"], ["torch===2.13.0"]]
    assert items["torch"]["metadata"]["version"] == "2.13.0"
    assert items["cuda-toolkit"]["metadata"]["version"] == "13.0.3.0"
