#!/usr/bin/env python3
"""Print the package's intra-package imports grouped by layer; exit 1 if any import goes upward
(or sideways between memory and tools).

Layers, bottom to top (a module may import its own layer and the layers below it)::

    config   mia_engine/config.py, every */config.py, coalesce.py, cpu_features.py, data.py, devices.py,
             files.py, onednn_cache.py, readiness.py, structs.py
    models   mia_engine/models/
    engines  mia_engine/engines/
    memory, tools   one layer; memory and tools may import each other's config only
    agent    mia_engine/agent/
    learner  mia_engine/learner/
    server   mia_engine/server/
    top      serve.py, services.py, batch.py, evaluate.py, eval_report.py, cli.py, index.py,
             doctor.py, contention.py, deploy/, __main__.py

Every import counts: module level, inside functions, and under ``if TYPE_CHECKING:``. A module the
script cannot place is reported too (add it to a layer here). Usage: ``python scripts/layers.py``
(``--quiet`` prints only the upward imports).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "mia_engine"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

LAYERS = ("config", "models", "engines", "memory/tools", "agent", "learner", "server", "top")
RANK = {name: i for i, name in enumerate(LAYERS)}

CONFIG_MODULES = {"", "coalesce", "config", "cpu_features", "data", "devices", "files", "onednn_cache", "readiness",
                  "structs"}
"""Top-level modules of the config layer ("" = the package's ``__init__``)."""
TOP_MODULES = {"serve", "services", "batch", "evaluate", "eval_report", "cli", "index", "doctor", "contention",
               "deploy", "__main__"}
PACKAGE_LAYERS = {"models": "models", "engines": "engines", "memory": "memory/tools", "tools": "memory/tools",
                  "agent": "agent", "learner": "learner", "server": "server"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The layer of ``mia_engine.x.y`` (None: not placed)."""
    parts = module.split(".")[1:]
    if parts and parts[-1] == "config":
        return "config"
    head = parts[0] if parts else ""
    if len(parts) <= 1 and head in CONFIG_MODULES:
        return "config"
    if head in TOP_MODULES:
        return "top"
    return PACKAGE_LAYERS.get(head)


def resolve(importer: str, is_package: bool, node: ast.ImportFrom | ast.Import, modules: set[str]) -> list[str]:
    """The package modules an import statement names (a ``from X import name`` names the submodule
    ``X.name`` when there is one, else ``X``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE]
    if node.level:
        base = importer.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != PACKAGE:
        return []
    found = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        found.append(sub if sub in modules else target)
    return sorted(set(found))


def allowed(source: str, target: str) -> bool:
    """Whether ``source`` may import ``target``."""
    src, dst = layer_of(source), layer_of(target)
    assert src is not None and dst is not None
    if RANK[dst] > RANK[src]:
        return False
    if src == dst == "memory/tools" and source.split(".")[1] != target.split(".")[1]:
        return False  # memory and tools share a layer but see only each other's config (config layer)
    return True


def _verdict(source: str, target: str) -> str:
    return "SIDEWAYS" if layer_of(source) == layer_of(target) else "UPWARD"


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    files = sorted(ROOT.rglob("*.py"))
    modules = {module_name(path) for path in files}
    edges: dict[str, list[str]] = {}
    unplaced = []
    for path in files:
        name = module_name(path)
        if layer_of(name) is None:
            unplaced.append(name)
        tree = ast.parse(path.read_text(), str(path))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(resolve(name, path.name == "__init__.py", node, modules))
        targets.discard(name)
        edges[name] = sorted(targets)
    for name in sorted({t for ts in edges.values() for t in ts} - set(edges)):
        unplaced.append(f"{name} (imported, no such module)")
    if unplaced:
        print("modules in no layer (add them to scripts/layers.py):")
        for name in unplaced:
            print(f"  {name}")
        return 1

    upward = []
    for layer in LAYERS:
        members = sorted(name for name in edges if layer_of(name) == layer)
        if not quiet:
            print(f"== {layer} ({len(members)} modules)")
        for name in members:
            bad = [t for t in edges[name] if not allowed(name, t)]
            upward += [(name, t) for t in bad]
            if not quiet:
                shown = [f"{t} [{layer_of(t)}]" + (f" {_verdict(name, t)}" if t in bad else "") for t in edges[name]]
                print(f"  {name}" + (": " + ", ".join(shown) if shown else ""))
    if upward:
        print(f"{len(upward)} upward imports:")
        for name, target in upward:
            print(f"  {name} [{layer_of(name)}] -> {target} [{layer_of(target)}] {_verdict(name, target)}")
        return 1
    print("no upward imports")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
