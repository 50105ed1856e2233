#!/usr/bin/env python3
"""The CUDA stack of the `gpu` extra: which CUDA major each of its packages brings, and whether this
machine's NVIDIA driver can run it.

    python scripts/cuda_stack.py check      # the extra's CUDA majors, from the registry; exit 1 on two
    python scripts/cuda_stack.py driver     # nvidia-smi's driver against torch's CUDA (one line)

``check`` walks the extra's dependency tree breadth first, each package once, reading each level's
requirements with ``pip install --dry-run --no-deps --report`` (nothing installed) as a Linux x86_64
GPU box resolves them, extras and markers evaluated, and lists every package that carries a CUDA
major with the path that pulled it in (``vllm -> torch -> cuda-toolkit -> nvidia-cuda-runtime``).
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
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package's driver table, in this checkout
from mia_engine.deploy.cuda_driver import driver_tuple, driver_verdict, torch_cuda  # noqa: E402

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

CUDA_VERSIONED = re.compile(r"^(cuda-toolkit|cuda-bindings|cuda-python|nvidia-cuda-[a-z-]+|nvidia-cublas|"
                            r"nvidia-nvjitlink|nvidia-nvvm|nvidia-nvfatbin|nvidia-nvptxcompiler|nvidia-nvtx)$")
"""Packages whose version is the CUDA version (``cuda-toolkit==13.0.3``, ``nvidia-cuda-runtime==13.0.96``).
Not cuFFT, cuRAND, cuSOLVER, cuSPARSE, cuFile, cuDNN or NCCL: their versions are their own (CUDA 13's
cuFFT is 12.0), so only a ``-cuNN`` suffix tells their CUDA."""
CUDA_TAG = re.compile(r"^cu(?:da)?(\d{2})\d?x?$")
"""A CUDA tag as one dash-separated part of a name or an extra: ``cu12`` (``faiss-gpu-cu12``,
``nvidia-cutlass-dsl[cu13]``), ``cuda12x`` (``cupy-cuda12x``), ``cu121``; the first two digits are the major."""

GPU_BOX_PLATFORMS = (*(f"manylinux_2_{glibc}_x86_64" for glibc in range(35, 4, -1)),
                     "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
"""Wheel platforms of a Linux x86_64 GPU box with glibc 2.35 (Ubuntu 22.04; vLLM's and torch's CUDA
wheels need 2.28, llguidance 2.31), spelled out: pip does not widen ``--platform manylinux_2_35`` to
the older tags by itself."""

UNREACHABLE = ("NewConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "Max retries exceeded",
               "Temporary failure in name resolution", "Name or service not known", "ProxyError",
               "Network is unreachable", "Connection refused")
"""pip's words for "the registry did not answer" (as opposed to "it has no such release")."""

SIDE_BY_SIDE_FLAVORS = ("nvidia-cutlass-dsl-libs-",)
"""Families whose ``<family>cuNN`` packages install side by side and whose importer loads only the newest
flavor the driver runs, so an older flavor beside a newer one is files on disk, never loaded. CUTLASS DSL
requires ``-libs-cu12`` whatever is asked (its ``[cu13]`` extra, which vLLM names, adds ``-libs-cu13``
beside it), and its ``cutlass/_mlir/_mlir_libs/__init__.py`` loads the highest ``cuN`` with N at most the
driver's CUDA major: cu13 on the driver >= 580 that torch's CUDA 13 needs anyway."""


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


def registry_metadata(requirements: list[str], timeout_s: float = 300) -> dict[str, dict]:
    """The registry's metadata of the wheel each requirement picks on the GPU box, by canonical package
    name, read with ``pip install --dry-run --no-deps --report``. Raises RegistryUnreachable when pip
    gets no answer, RuntimeError when the registry has no such wheel."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory(prefix="mia-cuda-stack-") as work:
        report = Path(work) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                   "--only-binary=:all:", *(f"--platform={p}" for p in GPU_BOX_PLATFORMS),
                   "--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}",
                   "--target", str(Path(work) / "target"), "--report", str(report), "--quiet",
                   "--disable-pip-version-check", "--retries", "1", "--timeout", "20",
                   *requirements]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_registry_env(work))
        if result.returncode != 0:
            error = result.stderr.strip().splitlines()
            if any(word in result.stderr for word in UNREACHABLE):
                raise RegistryUnreachable(error[-1] if error else "pip failed")
            raise RuntimeError("; ".join(line for line in error if line.startswith("ERROR")) or result.stderr)
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item for item in items}


def registry_source(requirements: list[str]) -> dict[str, dict]:
    """``registry_metadata``, with an exact pin that picked a local build (``torch==2.13.0`` answered by
    ``2.13.0+cpu`` from an extra index) read again as the release itself (``===``, see ``as_release``;
    not used first, since ``===13.0.3`` misses a release the registry spells ``13.0.3.0``)."""
    items = registry_metadata(requirements)
    local = [r for r in requirements if as_release(r) != r
             and "+" in items[canonicalize_name(Requirement(r).name)]["metadata"]["version"]]
    if local:
        items.update(registry_metadata([as_release(r) for r in local]))
    return items


def _registry_env(work: str) -> dict[str, str]:
    """pip's environment with the machine's own find-links folders and constraints replaced by empty ones:
    they shape what this machine installs, not what the registry offers a GPU box."""
    (Path(work) / "no-links").mkdir()
    (Path(work) / "no-constraints.txt").write_text("")
    return {**os.environ, "PIP_FIND_LINKS": str(Path(work) / "no-links"),
            "PIP_CONSTRAINT": str(Path(work) / "no-constraints.txt")}


# --- the dependency tree, breadth first ---

MetadataSource = Callable[[list[str]], dict[str, dict]]
"""Requirement strings -> the pip report items (``{"metadata": {"name", "version", "requires_dist"}}``)
of the wheels they pick, by canonical name: ``registry_source`` on a real check, a dict in tests."""


class Package:
    """One package of the walked tree (a plain class: scripts load without a ``sys.modules`` entry)."""

    def __init__(self, name: str, version: str, path: tuple[str, ...], requires_dist: list[str]) -> None:
        self.name = name
        self.version = version
        self.path = path
        """Package names from the extra's requirement down to this one, along the first path the walk found."""
        self.requires_dist = requires_dist
        self.requirements: list[str] = []
        """Every requirement that named it on the way, markers dropped."""
        self.extras: set[str] = set()
        self.followed: set[str] = set()
        """Its own requirements already walked (more join when a later path asks for more extras)."""

    def majors(self) -> set[int]:
        """The CUDA majors it carries: a ``-cuNN`` name or extra, a ``+cuNNN`` build, a CUDA-versioned
        pin; for a CUDA-versioned package that no requirement pins to a major, the release read."""
        majors = set().union(*(cuda_majors_of(r) for r in self.requirements))
        if m := CUDA_TAG.match(self.version.partition("+")[2].lower()):
            majors.add(int(m.group(1)))
        if not majors and CUDA_VERSIONED.match(self.name):
            majors.add(Version(self.version).major)
        return majors


def walk(roots: Iterable[str], fetch: MetadataSource) -> dict[str, Package]:
    """The dependency tree under ``roots`` on the GPU box, by canonical name. Breadth first, each package
    read once (one ``fetch`` per level, each package's specifiers of that level merged); a later path
    that asks for more of its extras adds those extras' requirements without reading it again."""
    tree: dict[str, Package] = {}
    pending = [(r, ()) for r in roots if applies(r)]
    while pending:
        pending = _walk_level(tree, pending, fetch)
    return tree


def _walk_level(tree: dict[str, Package], pending: list[tuple[str, tuple[str, ...]]],
                fetch: MetadataSource) -> list[tuple[str, tuple[str, ...]]]:
    """Add one level of (requirement, parent path) to ``tree``; the next level's."""
    new: dict[str, list[tuple[Requirement, tuple[str, ...]]]] = {}
    following: list[tuple[str, tuple[str, ...]]] = []
    for requirement, parent in pending:
        req = Requirement(requirement)
        if (name := canonicalize_name(req.name)) in tree:
            following += _join(tree[name], req, parent)
        else:
            new.setdefault(name, []).append((req, parent))
    items = fetch([_merged(name, [req for req, _ in reqs]) for name, reqs in new.items()]) if new else {}
    for name, reqs in new.items():
        if name not in items:
            raise RuntimeError(f"the package source has no metadata for {name}")
        metadata = items[name]["metadata"]
        tree[name] = Package(name, metadata["version"], (*reqs[0][1], name), metadata.get("requires_dist") or [])
        for req, parent in reqs:
            following += _join(tree[name], req, parent)
    return following


def _join(package: Package, req: Requirement, parent: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """Record one more requirement naming ``package``, made by the package at ``parent``; its own
    requirements that now apply and were not walked yet (all of them the first time, those of newly asked
    extras later, reached through this parent)."""
    bare = Requirement(str(req))
    bare.marker = None
    package.requirements.append(str(bare))
    package.extras |= {canonicalize_name(extra) for extra in req.extras}
    now = [r for r in package.requires_dist if r not in package.followed and applies(r, package.extras)]
    package.followed.update(now)
    return [(r, (*parent, package.name)) for r in now]


def _merged(name: str, reqs: list[Requirement]) -> str:
    """One requirement for pip: the name with every specifier a level asks of it (extras and markers are
    the walk's business, not pip's)."""
    return f"{name}{SpecifierSet(','.join(str(req.specifier) for req in reqs if req.specifier))}"


def gpu_stack(extra: str = "gpu", pyproject: Path = PYPROJECT,
              fetch: MetadataSource = registry_source) -> dict[str, Package]:
    """The dependency tree of ``extra`` as a Linux x86_64 GPU box resolves it."""
    return walk(extra_requirements(extra, pyproject), fetch)


def unloaded_flavors(tree: dict[str, Package]) -> dict[str, str]:
    """Side-by-side flavors never loaded (``SIDE_BY_SIDE_FLAVORS``): name -> the newer flavor beside it."""
    families: dict[str, dict[int, str]] = {}
    for name in tree:
        for family in SIDE_BY_SIDE_FLAVORS:
            if name.startswith(family) and (m := CUDA_TAG.match(name.removeprefix(family))):
                families.setdefault(family, {})[int(m.group(1))] = name
    return {name: flavors[max(flavors)] for flavors in families.values()
            for major, name in flavors.items() if major != max(flavors)}


def check(tree: dict[str, Package]) -> tuple[bool, str]:
    """(one CUDA major?, a verdict line, then a line per package that carries a CUDA major: its major,
    name, release and the path that pulled it in; unloaded side-by-side flavors are listed, not counted)."""
    local = [f"{p.name} {p.version}" for p in tree.values() if "+" in p.version]
    if local:
        return False, f"a local build, not a registry release, was read: {', '.join(local)}"
    unloaded = unloaded_flavors(tree)
    carriers = sorted(((major, p) for p in tree.values() for major in p.majors()),
                      key=lambda hit: (hit[0], len(hit[1].path), hit[1].path))
    majors = sorted({major for major, p in carriers if p.name not in unloaded})
    lines = [f"  CUDA {major}  {p.name} {p.version}  {' -> '.join(p.path)}"
             + (f"  (installed, not loaded: the importer loads {unloaded[p.name]})" if p.name in unloaded else "")
             for major, p in carriers]
    if not majors:
        return False, "no CUDA package found: the extra brings no CUDA runtime"
    if len(majors) == 1:
        verdict = f"one CUDA major (CUDA {majors[0]}) over {len(tree)} packages"
    else:
        verdict = f"{len(majors)} CUDA majors in one process ({', '.join(f'CUDA {m}' for m in majors)})"
    return len(majors) == 1, "\n".join([verdict, *lines])


# --- the driver (its minimum per CUDA major: mia_engine/deploy/cuda_driver.py, which serve's preflight reads too) ---

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
        return min(versions, key=driver_tuple)
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="the CUDA majors of the extra's dependency tree, from the "
                                       "registry, each with the path that pulls it in; exit 1 on two")
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
    """One line: 0 = the driver runs torch's CUDA; 1 = it is too old (the line, on stderr, names the driver,
    the CUDA and the minimum; install.sh stops); 2 = nothing to check (no driver answered, no CUDA torch)."""
    driver = installed_driver()
    cuda = cuda or torch_cuda()
    if driver is None:
        print("mia-engine install: no NVIDIA driver answered (nvidia-smi --query-gpu=driver_version)")
        return 2
    if cuda is None:
        print(f"mia-engine install: NVIDIA driver {driver}, but no torch built for CUDA is installed")
        return 2
    is_ok, line = driver_verdict(driver, cuda)
    print(f"mia-engine install: {line}", file=sys.stdout if is_ok else sys.stderr)
    return 0 if is_ok else 1


if __name__ == "__main__":
    sys.exit(main())
