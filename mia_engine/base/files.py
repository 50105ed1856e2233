"""Writing files and folders so that a crash or a concurrent writer never leaves half of one behind:
write a temporary sibling, then rename it into place (and, where it must survive power loss, fsync the
data before the rename and the folder after it).

Used by the model cache, the passage indexes, the learner's published adapters, its checkpoints and the
memory snapshot. Part of the config layer for layering purposes: it imports nothing of the package.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


def fsync_dir(folder: Path) -> None:
    """Make created or renamed names in ``folder`` durable (the directory entries, not only file data)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(folder: Path) -> None:
    """Flush every file below a freshly written folder before it is renamed into place."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


@contextmanager
def atomic_dir(target: Path, *, tmp: Path | None = None, durable: bool = False,
               keep_existing: bool = False) -> Iterator[Path]:
    """A folder written whole or not at all: the block fills the yielded empty temporary folder (``tmp``,
    else a private ``.<name>.*`` sibling from ``mkdtemp``), which is renamed to ``target`` when the block
    exits normally. The temporary folder is removed whatever happens.

    The rename never replaces a non-empty folder: it raises ``OSError``, unless ``keep_existing`` and
    ``target`` is now a folder (a concurrent writer finished first), whose copy is then kept. ``durable``:
    the files are fsynced before the rename and the parent folder after it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if tmp is None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    else:
        tmp.mkdir()
    try:
        yield tmp
        if durable:
            fsync_files(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (keep_existing and target.is_dir()):
                raise
            log.info("%s was built concurrently by another process; using that copy", target)
            return
        if durable:
            fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_file_atomic(path: Path, data: bytes, *, tmp: Path | None = None, mode: int = 0o666) -> None:
    """Replace the file ``path`` with ``data`` durably: write ``tmp`` (default ``<path>.tmp``, created with
    ``mode``), fsync it, rename it over ``path``, fsync the folder. A crash leaves the old file or the new
    one; a leftover ``tmp`` is the caller's to clean at its next start."""
    tmp = tmp or path.with_name(path.name + ".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
