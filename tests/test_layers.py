"""The package's imports form layers (``scripts/layers.py``): nothing imports a layer above its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "layers.py"


def test_no_upward_imports() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--quiet"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
