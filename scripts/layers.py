#!/usr/bin/env python3
"""Print the package's intra-package imports grouped by layer; exit 1 if any import goes upward
(or sideways between memory and tools), or if the imports form a cycle.

Layers, bottom to top (a module may import its own layer and the layers below it)::

    config   mia_engine/config/ (one module per section), devices.py, base/ (structs, files, readiness,
             coalesce, data)
    models   mia_engine/models/
    engines  mia_engine/engines/
    memory, tools   one layer; memory and tools may import each other's config only
    agent    mia_engine/agent/
    learner  mia_engine/learner/
    server   mia_engine/server/
    top      cli.py, preflight.py, serve.py, services.py, index.py, __main__.py, deploy/, evals/, doctor/

Every import counts: module level, inside functions, and under ``if TYPE_CHECKING:``. A module the
script cannot place is reported too (add it to a layer here). A cycle (``a`` imports ``b`` imports ...
imports ``a``) is refused even inside one layer: a function-local import that breaks it at run time
still leaves two modules that cannot be read, tested or moved apart. Usage: ``python scripts/layers.py``
(``--quiet`` prints only what is wrong; ``--root DIR`` checks another copy of the package).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "mia_engine"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

LAYERS = ("config", "models", "engines", "memory/tools", "agent", "learner", "server", "top")
RANK = {name: i for i, name in enumerate(LAYERS)}

CONFIG_MODULES = {"", "config", "devices"}
"""Top-level modules of the config layer ("" = the package's ``__init__``)."""
TOP_MODULES = {"cli", "preflight", "serve", "services", "index", "__main__", "deploy", "evals", "doctor"}
PACKAGE_LAYERS = {"base": "config", "config": "config", "models": "models", "engines": "engines", "memory": "memory/tools",
                  "tools": "memory/tools", "agent": "agent", "learner": "learner", "server": "server"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The layer of ``mia_engine.x.y`` (None: not placed)."""
    parts = module.split(".")[1:]
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


def import_graph(root: Path) -> dict[str, list[str]]:
    """Each module of the package under ``root`` and the package modules it imports (itself left out)."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in files}
    edges: dict[str, list[str]] = {}
    for path in files:
        name = module_name(path, root)
        tree = ast.parse(path.read_text(), str(path))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(resolve(name, path.name == "__init__.py", node, modules))
        targets.discard(name)
        edges[name] = sorted(targets)
    return edges


def import_cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """One cycle per group of modules that import each other (a strongly connected component of the
    graph), as ``[a, b, ..., a]`` from the group's first module by name, shortest way round."""
    cycles = []
    for group in _strongly_connected(edges):
        if len(group) > 1:
            cycles.append(_shortest_cycle(min(group), group, edges))
    return sorted(cycles)


def _strongly_connected(edges: dict[str, list[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a deep package)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def _shortest_cycle(start: str, group: set[str], edges: dict[str, list[str]]) -> list[str]:
    """A shortest path from ``start`` back to itself inside ``group`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in edges.get(node, ()):
                if child not in group:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a cycle but none was found")


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    root = Path(argv[argv.index("--root") + 1]).resolve() if "--root" in argv else ROOT
    edges = import_graph(root)
    unplaced = [name for name in edges if layer_of(name) is None]
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
    cycles = import_cycles(edges)
    if cycles:
        print(f"{len(cycles)} import cycles (module-level and function-local imports alike):")
        for cycle in cycles:
            print("  " + " -> ".join(cycle))
    if upward or cycles:
        return 1
    print("no upward imports, no import cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
