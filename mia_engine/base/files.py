"""Writing files and folders so that a crash or a concurrent writer never leaves half of one behind:
write a temporary sibling, then rename it into place (and, where it must survive power loss, fsync the
data before the rename and the folder after it); and the folders the server writes, made or accepted only
when no other user can plant or change what is written there (``private_dir``).

Used by the model cache, the passage indexes, the learner's published adapters, its checkpoints and the
memory snapshot. Part of the config layer for layering purposes: it imports nothing of the package.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700
"""Mode of every folder the server creates: only this user can list, read or write it."""


class UnsafeFolder(ValueError):
    """A folder the server would write that another user could control; the message is one line that
    names the config field, the path, what is wrong and the fix."""


def private_dir(path: Path, field: str, *, exact: bool = False) -> Path:
    """``path`` as a folder that only this user controls: created (with missing parents) mode 0700, or
    an existing one checked; ``UnsafeFolder`` otherwise. ``field`` is the config field the message names.

    Each missing folder is made by ``os.mkdir`` with mode 0700, so it never exists with wider bits; one
    that another process made first (``FileExistsError``) is checked like any existing folder, never
    taken on trust. An existing folder must be a directory owned by this user that no other user can
    write (group/other write bits off): a user's own data dir at the usual 0755 is accepted, as ssh
    accepts a 0755 home. ``exact`` (a folder at a predictable name in a folder every user can write, such
    as ``/dev/shm``) demands more, since another user may have made it first: a real directory, not a
    symbolic link, with no group/other bits at all. Without ``exact`` a link is followed only when this
    user made it (a data dir linked to a bigger disk), and its target is checked. Existing parents are not
    checked: each folder the server writes is checked by its own call, the data dir first."""
    path = Path(path)
    made = False
    for folder in _make_missing(path):
        _check_private_dir(folder, field, exact=exact)
        made = True
    if not made:
        _check_private_dir(path, field, exact=exact)
    return path


def _make_missing(path: Path) -> Iterator[Path]:
    """Make ``path``'s missing folders, outermost first, each by ``os.mkdir`` with mode 0700 (``mkdir``'s
    ``parents`` gives the mode to the last one only); yields each one once its ``mkdir`` is done (or found
    it made meanwhile by someone else, for the caller to check)."""
    missing, folder = [], path
    while not os.path.lexists(folder) and folder != folder.parent:  # a dangling link counts as present
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
        yield folder


def _check_private_dir(path: Path, field: str, *, exact: bool) -> None:
    fix = f"remove it or set {field} to a folder of your own"
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if exact or st.st_uid != os.geteuid():
            whose = "" if st.st_uid == os.geteuid() else f" made by another user (uid {st.st_uid})"
            raise UnsafeFolder(f"{field}: {path} is a symbolic link{whose}, not a real folder; {fix}")
        try:
            st = os.stat(path)
        except OSError as err:
            raise UnsafeFolder(f"{field}: {path} is a link to nothing usable ({err.strerror}); {fix}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"{field}: {path} is not a folder; {fix}")
    if st.st_uid != os.geteuid():
        raise UnsafeFolder(f"{field}: {path} belongs to another user (uid {st.st_uid}), who can change what "
                           f"the server writes there; {fix}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & (0o077 if exact else 0o022):
        raise UnsafeFolder(f"{field}: {path} is open to other users (mode {mode:04o}); run: chmod 700 {path}")


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
    the files are fsynced before the rename and the parent folder after it. Missing parents are made 0700
    (the temporary folder is 0700 too), as ``private_dir`` makes them."""
    list(_make_missing(target.parent))
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


def write_file_atomic(path: Path, data: bytes | Iterable[bytes], *, tmp: Path | None = None,
                      mode: int = 0o666) -> None:
    """Replace the file ``path`` with ``data`` (bytes, or chunks written as they come) durably: write
    ``tmp`` (default ``<path>.tmp``, created with ``mode``), fsync it, rename it over ``path``, fsync the
    folder. A crash leaves the old file or the new one; a leftover ``tmp`` is the caller's to clean at its
    next start."""
    tmp = tmp or path.with_name(path.name + ".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as file:
        for chunk in (data,) if isinstance(data, bytes | bytearray) else data:
            file.write(chunk)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
