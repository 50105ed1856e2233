#!/usr/bin/env python3
"""Every bundled config as the server sees it, to check that an edit of ``configs/*.toml`` changed no
effective value.

    python scripts/config_snapshot.py before.json              # write {name: load_config(name)} as JSON
    python scripts/config_snapshot.py --compare before.json    # exit 1 and print each path that differs

Each config is ``msgspec.to_builtins(load_config(name))``: defaults filled in, profiles expanded, so a
key dropped from a TOML because it equals its default leaves the snapshot unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mia_engine.config import load_config  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def snapshot() -> dict[str, Any]:
    """{config name: its effective config}, as JSON types (tuples become lists, as in the written file)."""
    configs = {path.stem: msgspec.to_builtins(load_config(path.stem)) for path in sorted(CONFIGS.glob("*.toml"))}
    return json.loads(json.dumps(configs))


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """Dotted paths where the two differ (a key on one side only counts)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            where = f"{path}.{key}" if path else key
            if key not in before or key not in after:
                found.append(f"{where}: {'added' if key not in before else 'removed'}")
            else:
                found += differences(before[key], after[key], where)
        return found
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--compare"] and len(argv) == 2:
        found = differences(json.loads(Path(argv[1]).read_text()), snapshot())
        print("\n".join(found) if found else "every bundled config is the same")
        return 1 if found else 0
    if len(argv) == 1:
        Path(argv[0]).write_text(json.dumps(snapshot(), indent=1, sort_keys=True))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
