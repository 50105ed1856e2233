"""The package's imports form layers (``scripts/layers.py``): nothing imports a layer above its own, and
no modules import each other in a cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "layers.py"


def _layers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--quiet", *args], capture_output=True, text=True, timeout=60)


def test_no_upward_imports_and_no_cycles() -> None:
    result = _layers()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no import cycles" in result.stdout


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "mia_engine"
    for name, text in {"__init__.py": "", "memory/__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_a_cycle_broken_by_a_function_local_import_is_refused_and_printed(tmp_path: Path) -> None:
    """``store`` imports ``index`` at module level and ``index`` imports ``store`` inside a function (which
    Python runs, so only the import-time cycle is broken); ``journal`` -> ``jsonl`` -> ``journal`` too."""
    package = _package(tmp_path, {
        "memory/store.py": "from .index import build\n",
        "memory/index.py": "def build():\n    from .store import open_store\n",
        "memory/journal.py": "from . import jsonl\n",
        "memory/jsonl.py": "from mia_engine.memory.journal import Journal\n",
        "memory/service.py": "from .store import open_store\n",  # into the cycle, not part of it
    })
    result = _layers("--root", str(package))
    assert result.returncode == 1, result.stdout
    assert "2 import cycles" in result.stdout
    assert "  mia_engine.memory.index -> mia_engine.memory.store -> mia_engine.memory.index\n" in result.stdout
    assert "  mia_engine.memory.journal -> mia_engine.memory.jsonl -> mia_engine.memory.journal\n" in result.stdout
    assert "service" not in result.stdout


def test_a_longer_cycle_is_printed_the_shortest_way_round(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "memory/a.py": "from . import b\nfrom . import d\n",
        "memory/b.py": "from . import c\n",
        "memory/c.py": "import mia_engine.memory.a\n",
        "memory/d.py": "from . import e\n",
        "memory/e.py": "from . import f\n",
        "memory/f.py": "from . import a\n",
    })
    result = _layers("--root", str(package))
    assert result.returncode == 1 and "1 import cycles" in result.stdout, result.stdout
    assert "  mia_engine.memory.a -> mia_engine.memory.b -> mia_engine.memory.c -> mia_engine.memory.a\n" in result.stdout


def test_a_package_without_cycles_passes(tmp_path: Path) -> None:
    package = _package(tmp_path, {"memory/store.py": "from .index import build\n", "memory/index.py": "X = 1\n"})
    result = _layers("--root", str(package))
    assert result.returncode == 0, result.stdout
