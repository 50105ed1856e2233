"""The model cache: where embedded models live, and how they are built exactly once.

A build writes into a temporary sibling directory and is renamed into place, so a process that is
killed mid-build, or two processes that start at once, can never leave a half-written model behind:
the loser of a concurrent build simply discards its copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..base.files import atomic_dir

log = logging.getLogger(__name__)

HOME_ENV = "MIA_HOME"


def default_home() -> Path:
    """``$MIA_HOME`` if set, else ``$XDG_CACHE_HOME/mia_engine`` (``~/.cache/mia_engine``)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mia_engine"


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, running ``build(tmp_dir)`` and renaming it into place if it is missing."""
    if target.is_dir():
        return target
    with atomic_dir(target, keep_existing=True) as tmp:
        log.info("building %s (first use; cached afterwards)", target)
        build(tmp)
    return target


def tree_digest(root: Path) -> str:
    """SHA-256 over every file's relative path and bytes, in sorted order: the build's identity."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
