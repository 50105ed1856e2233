"""Runs one of the product's own commands that writes a JSON result (``python -m mia_engine eval ... --out
FILE``) and adds the provenance every benchmark file carries (``results_io.collect_meta``: commit, machine,
versions, the command, start and end times, load) to that file as its ``meta``, so RESULTS can say where a
figure came from without the product depending on the bench folder.

    python bench/stamped.py -- python -m mia_engine eval --config default --dataset bench/devset_wiki.jsonl \
        --split heldout --modes bare react mia_g1 --concurrency 16 --out bench/results/quality_heldout_v21.json

The file is the command's ``--out`` argument; the command's exit code is this script's, and a command that
fails leaves its file (if any) unstamped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.results_io import collect_meta, finish  # noqa: E402


def out_path(command: list[str]) -> Path:
    """The command's ``--out`` file (``--out F`` or ``--out=F``)."""
    for i, arg in enumerate(command):
        if arg == "--out" and i + 1 < len(command):
            return Path(command[i + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    raise SystemExit("stamped.py: the command names no --out file")


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        raise SystemExit("usage: python bench/stamped.py -- <command ... --out FILE>")
    out = out_path(command)
    name = command[3] if command[:3] == ["python", "-m", "mia_engine"] and len(command) > 3 else Path(command[0]).stem
    meta = collect_meta(name, command)
    rc = subprocess.call([sys.executable if command[0] == "python" else command[0], *command[1:]])
    if rc != 0:
        return rc
    doc = json.loads(out.read_text())
    out.write_text(json.dumps({"meta": finish(meta), **doc}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
