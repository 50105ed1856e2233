#!/usr/bin/env python3
"""The CUDA stack of the `gpu` extra: which CUDA major each of its packages brings, and whether this
machine's NVIDIA driver can run it.

    python scripts/cuda_stack.py check      # the extra's CUDA majors, from the registry; exit 1 on two
    python scripts/cuda_stack.py driver     # nvidia-smi's driver against torch's CUDA (one line)

``check`` reads, with ``pip install --dry-run --no-deps --report`` (metadata only, nothing installed),
the requirements of every package of the extra and of the torch that the extra's vLLM pins, as a
Linux x86_64 GPU box resolves them. A full resolve is not needed, and would download the stack.
Two CUDA runtimes in one process (say torch on CUDA 13 and a FAISS build on CUDA 12) load two copies
of cuBLAS and friends and need the newer major's driver anyway; one major is the rule.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

CUDA_VERSIONED = re.compile(r"^(cuda-toolkit|cuda-bindings|cuda-python|nvidia-cuda-[a-z-]+|nvidia-cublas|"
                            r"nvidia-nvjitlink|nvidia-nvvm|nvidia-nvfatbin|nvidia-nvptxcompiler|nvidia-nvtx)$")
"""Packages whose version is the CUDA version (``cuda-toolkit==13.0.3``, ``nvidia-cuda-runtime==13.0.96``).
Not cuFFT, cuRAND, cuSOLVER, cuSPARSE, cuFile, cuDNN or NCCL: their versions are their own (CUDA 13's
cuFFT is 12.0), so only a ``-cuNN`` suffix tells their CUDA."""
CUDA_TAG = re.compile(r"^cu(?:da)?(\d{2})\d?x?$")
"""A CUDA tag as one dash-separated part of a name or an extra: ``cu12`` (``faiss-gpu-cu12``,
``nvidia-cutlass-dsl[cu13]``), ``cuda12x`` (``cupy-cuda12x``), ``cu121``; the first two digits are the major."""

MIN_DRIVER = {12: "525.60.13", 13: "580"}
"""Oldest Linux x86_64 driver each CUDA major runs on (minor version compatibility): NVIDIA's CUDA
Compatibility guide, "Minor Version Compatibility", table 1 (CUDA 13.x >= 580, 12.x >= 525), and the
CUDA Toolkit release notes' driver table for 12.x (>= 525.60.13);
https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html"""

GPU_BOX_PLATFORMS = (*(f"manylinux_2_{glibc}_x86_64" for glibc in range(35, 4, -1)),
                     "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
"""Wheel platforms of a Linux x86_64 GPU box with glibc 2.35 (Ubuntu 22.04; vLLM's and torch's CUDA
wheels need 2.28, llguidance 2.31), spelled out: pip does not widen ``--platform manylinux_2_35`` to
the older tags by itself."""

UNREACHABLE = ("NewConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "Max retries exceeded",
               "Temporary failure in name resolution", "Name or service not known", "ProxyError",
               "Network is unreachable", "Connection refused")
"""pip's words for "the registry did not answer" (as opposed to "it has no such release")."""


class RegistryUnreachable(RuntimeError):
    """pip could not reach the package registry (offline machine): the check cannot say anything."""


# --- which CUDA major a requirement brings (pure) ---

def cuda_majors_of(requirement: str) -> set[int]:
    """The CUDA majors that installing ``requirement`` forces: none for a package without CUDA, or for a
    range such as ``cuda-bindings>=12.8`` that either major satisfies; two for ``pkg[cu12,cu13]``."""
    req = Requirement(requirement)
    name = req.name.lower().replace("_", "-")
    parts = [*name.split("-"), *(extra.lower() for extra in req.extras)]
    majors = {int(m.group(1)) for part in parts if (m := CUDA_TAG.match(part))}
    for spec in req.specifier:  # a local build label: torch==2.13.0+cu130
        local = spec.version.partition("+")[2]
        if m := CUDA_TAG.match(local.lower()):
            majors.add(int(m.group(1)))
    if not majors and CUDA_VERSIONED.match(name):
        major = _single_major(req.specifier)
        majors = set() if major is None else {major}
    return majors


def cuda_majors(requirements: Iterable[str]) -> dict[int, list[str]]:
    """The CUDA majors among ``requirements``, each with the requirements that force it."""
    majors: dict[int, list[str]] = {}
    for requirement in requirements:
        for major in sorted(cuda_majors_of(requirement)):
            majors.setdefault(major, []).append(requirement)
    return majors


def _single_major(specifier: SpecifierSet) -> int | None:
    """The one major version a specifier set allows, or None when it allows several or any."""
    low, high = 0, None
    for spec in specifier:
        try:
            version = Version(spec.version.removesuffix(".*"))
        except InvalidVersion:  # an arbitrary-equality string
            return None
        if spec.operator in ("==", "===", "~="):
            low, high = max(low, version.major), version.major if high is None else min(high, version.major)
        elif spec.operator in (">=", ">"):
            low = max(low, version.major)
        elif spec.operator in ("<", "<="):
            top = version.major - 1 if spec.operator == "<" and version.release[1:] in ((), (0,), (0, 0)) \
                else version.major
            high = top if high is None else min(high, top)
    return low if high is not None and low == high else None


# --- the gpu extra's requirements, from pyproject.toml and the registry's metadata ---

def extra_requirements(extra: str, pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement strings of one optional-dependency group of the project."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return list(extras[extra])


def target_environment() -> dict[str, str]:
    """Marker values of a Linux x86_64 GPU box running this Python."""
    env = default_environment()
    env.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix")
    return env


def applies(requirement: str, extras: Iterable[str] = ()) -> bool:
    """Whether ``requirement`` is installed on the GPU box, with the parent's ``extras`` requested."""
    marker = Requirement(requirement).marker
    if marker is None:
        return True
    return any(marker.evaluate({**target_environment(), "extra": extra}) for extra in ("", *extras))


def as_release(requirement: str) -> str:
    """An exact ``==V`` pin as ``===V``: the release itself, never a local build such as ``V+cpu`` that a
    machine's find-links folder may hold."""
    req = Requirement(requirement)
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        return requirement
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}==={specs[0].version}"


def registry_metadata(requirements: list[str], timeout_s: float = 120) -> dict[str, dict]:
    """The registry's metadata of the wheel each requirement picks on the GPU box, by package name, read
    with ``pip install --dry-run --no-deps --report``. Raises RegistryUnreachable when pip gets no
    answer, RuntimeError when the registry has no such wheel."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory(prefix="mia-cuda-stack-") as work:
        report = Path(work) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                   "--only-binary=:all:", *(f"--platform={p}" for p in GPU_BOX_PLATFORMS),
                   "--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}",
                   "--target", str(Path(work) / "target"), "--report", str(report), "--quiet",
                   "--disable-pip-version-check", "--retries", "1", "--timeout", "20",
                   *[as_release(r) for r in requirements]]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_registry_env(work))
        if result.returncode != 0:
            error = result.stderr.strip().splitlines()
            if any(word in result.stderr for word in UNREACHABLE):
                raise RegistryUnreachable(error[-1] if error else "pip failed")
            raise RuntimeError("; ".join(line for line in error if line.startswith("ERROR")) or result.stderr)
        items = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower().replace("_", "-"): item for item in items}


def _registry_env(work: str) -> dict[str, str]:
    """pip's environment with the machine's own find-links folders and constraints replaced by empty ones:
    they shape what this machine installs, not what the registry offers a GPU box."""
    (Path(work) / "no-links").mkdir()
    (Path(work) / "no-constraints.txt").write_text("")
    return {**os.environ, "PIP_FIND_LINKS": str(Path(work) / "no-links"),
            "PIP_CONSTRAINT": str(Path(work) / "no-constraints.txt")}


def requires(item: dict, extras: Iterable[str] = ()) -> list[str]:
    """What one report item's package requires on the GPU box (markers evaluated)."""
    return [r for r in item["metadata"].get("requires_dist", []) if applies(r, extras)]


def gpu_stack(extra: str = "gpu", pyproject: Path = PYPROJECT) -> dict[str, list[str]]:
    """The CUDA-relevant requirements of ``extra`` by where they come from: the extra itself, each of its
    packages' metadata, and the metadata of the torch its vLLM pins."""
    own = [r for r in extra_requirements(extra, pyproject) if applies(r)]
    stack = {f"[{extra}]": own}
    metadata = registry_metadata(own)
    for requirement in own:
        req = Requirement(requirement)
        item = metadata[req.name.lower().replace("_", "-")]
        stack[_label(item)] = requires(item, req.extras)
    vllm = next((Requirement(r) for r in own if Requirement(r).name.lower().startswith("vllm")), None)
    if vllm is None:
        raise RuntimeError(f"the {extra!r} extra has no vllm requirement")
    torch_pin = next((r for r in stack[_label(metadata[vllm.name.lower()])]
                      if Requirement(r).name.lower() == "torch"), None)
    if torch_pin is None:
        raise RuntimeError(f"{vllm} does not pin torch")
    torch = Requirement(torch_pin)
    item = registry_metadata([f"torch{torch.specifier}"])["torch"]
    stack[_label(item)] = requires(item)
    return stack


def _label(item: dict) -> str:
    return f"{item['metadata']['name']} {item['metadata']['version']}"


def check(stack: dict[str, list[str]]) -> tuple[bool, str]:
    """(one CUDA major?, a one-line verdict naming each major's first requirements and their source)."""
    majors: dict[int, list[str]] = {}
    for source, requirements in stack.items():
        for major, reqs in cuda_majors(requirements).items():
            majors.setdefault(major, []).extend(f"{r.split(';')[0].strip()} ({source})" for r in reqs)
    local = [source for source in stack if "+" in source]
    if local:
        return False, f"a local build, not a registry release, was read: {', '.join(local)}"
    if not majors:
        return False, "no CUDA package found: the extra brings no CUDA runtime"
    parts = [f"CUDA {major}: {', '.join(reqs[:3])}{' ...' if len(reqs) > 3 else ''}"
             for major, reqs in sorted(majors.items())]
    if len(majors) == 1:
        return True, f"one CUDA major. {parts[0]}"
    return False, f"{len(majors)} CUDA majors in one process. " + " | ".join(parts)


# --- the driver ---

def driver_verdict(driver: str, cuda: str) -> tuple[bool, str]:
    """(can driver ``driver`` run CUDA ``cuda``?, one line saying so or what driver is needed)."""
    major = Version(cuda).major
    needed = MIN_DRIVER.get(major)
    if needed is None:
        return False, f"NVIDIA driver {driver}; no known minimum for CUDA {cuda}: see NVIDIA's compatibility table"
    if _driver_tuple(driver) >= _driver_tuple(needed):
        return True, f"NVIDIA driver {driver} runs CUDA {cuda} (needs >= {needed}): OK"
    return False, (f"NVIDIA driver {driver} is too old for CUDA {cuda}, which needs >= {needed}: update the "
                   "driver (or install NVIDIA's CUDA forward compatibility package)")


def _driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.strip().split("."))


def installed_driver() -> str | None:
    """The lowest driver version nvidia-smi reports over the GPUs, or None without a working nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    versions = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not versions:
        return None
    try:
        return min(versions, key=_driver_tuple)
    except ValueError:
        return None


def installed_cuda() -> str | None:
    """The CUDA version this environment's torch was built for, or None for a CPU torch or none."""
    try:
        import torch  # here, not at the top: ``check`` runs where torch is not installed
    except ImportError:
        return None
    return torch.version.cuda


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="the extra's CUDA majors from the registry; exit 1 on two")
    check_parser.add_argument("--extra", default="gpu")
    driver_parser = commands.add_parser("driver", help="nvidia-smi's driver against the CUDA torch was built for")
    driver_parser.add_argument("--cuda", help="CUDA version to check against (default: this torch's)")
    args = parser.parse_args(argv)
    if args.command == "check":
        try:
            is_ok, line = check(gpu_stack(args.extra))
        except RegistryUnreachable as error:
            print(f"cuda-stack: the package registry did not answer ({error})")
            return 2
        print(f"cuda-stack [{args.extra}]: {line}")
        return 0 if is_ok else 1
    return _driver_main(args.cuda)


def _driver_main(cuda: str | None) -> int:
    driver = installed_driver()
    cuda = cuda or installed_cuda()
    if driver is None:
        print("mia-engine install: no NVIDIA driver answered (nvidia-smi --query-gpu=driver_version)")
        return 1
    if cuda is None:
        print(f"mia-engine install: NVIDIA driver {driver}, but no torch built for CUDA is installed")
        return 1
    is_ok, line = driver_verdict(driver, cuda)
    print(f"mia-engine install: {line}")
    return 0 if is_ok else 1


if __name__ == "__main__":
    sys.exit(main())
