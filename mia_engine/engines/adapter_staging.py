"""Private copies of the adapter folders that requests name, so that what was checked is what the engine loads.

A folder named by ``POST /v1/adapters/{role}`` or ``/v1/load_lora_adapter`` lies in an adapter folder that
its owner, or whoever may write a folder below it, can change at any time: between the check of the
weights and vLLM's read of them (and each later read: vLLM loads an evicted adapter again from its path),
the files could be swapped. So the registry loads a copy: ``AdapterStaging.stage`` opens the folder one
path component at a time without following a symbolic link, refuses links and special files in it
(``AdapterFileRefused``, naming the file), and reads each file the engine reads (``ADAPTER_FILES``, opened
``O_NOFOLLOW``) once, into a new folder of this process's own under ``<data_dir>/adapter-staging``; the
check and the engine read that copy, which no one else can write.

A copy is removed when its version leaves the engine (``discard``), the process's whole folder when it
stops (``close``), and a dead process's folder when the next one opens the staging folder: each process
holds a lock (``flock``) on its folder for its life, so a folder whose lock is free is a leftover, and a
second server on the same data dir (which its memory store then refuses) never removes a live one's.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from ..base.files import private_dir

log = logging.getLogger(__name__)

STAGING_DIR = "adapter-staging"
"""The staging folder's name in the data dir (not under ``<data_dir>/adapters``, from which requests load)."""
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files of a PEFT folder that the check, vLLM's LoRA loader and the learner's peft read; the rest of
the folder (a README, training state) is not copied."""
COPY_CHUNK_BYTES = 1 << 20
_RUN_PREFIX = "run-"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class AdapterFileRefused(ValueError):
    """A file of an adapter folder that is not a regular file of its own (a symbolic link, a device, a pipe),
    or a folder on its path that turned into a link: refused before anything is read (HTTP 403, naming it)."""


class AdapterStaging:
    """This process's folder of private adapter copies under ``root`` (made or checked with
    ``base.files.private_dir``), locked for the process's life; dead processes' folders are removed here."""

    def __init__(self, root: Path) -> None:
        self.root = private_dir(Path(root), "data_dir")
        root_fd = os.open(self.root, _DIR_FLAGS)
        try:
            fcntl.flock(root_fd, fcntl.LOCK_EX)  # no other process makes or removes a run folder meanwhile
            self._remove_dead_runs()
            self.run_dir = Path(tempfile.mkdtemp(prefix=_RUN_PREFIX, dir=self.root))
            self._lock_fd = os.open(self.run_dir, _DIR_FLAGS)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(root_fd)

    def stage(self, source: Path) -> Path:
        """A private copy of the adapter folder ``source`` (an absolute path with its links resolved): a new
        folder holding those of ``ADAPTER_FILES`` that ``source`` has. ``AdapterFileRefused`` for a link or
        a special file in it; ``FileNotFoundError`` / ``NotADirectoryError`` where no folder is. Blocking."""
        folder_fd = _open_folder(source)
        try:
            names = _adapter_files(folder_fd, source)
            target = Path(tempfile.mkdtemp(prefix="adapter-", dir=self.run_dir))
            try:
                for name in names:
                    _copy(folder_fd, source / name, target / name)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            return target
        finally:
            os.close(folder_fd)

    def discard(self, staged: Path) -> None:
        """Remove a copy ``stage`` made (anything else is left alone). Blocking."""
        if staged.parent == self.run_dir:
            shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        """Remove every copy of this process and its folder, and release its lock (once; later calls do nothing)."""
        if self._lock_fd < 0:
            return
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = -1

    def _remove_dead_runs(self) -> None:
        """Remove the folders of processes that are gone (their lock is free); the caller holds the root's lock."""
        removed = 0
        for entry in os.scandir(self.root):
            if not entry.name.startswith(_RUN_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            fd = os.open(entry.path, _DIR_FLAGS | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live server's
                continue
            else:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
            finally:
                os.close(fd)
        if removed:
            log.info("removed the adapter copies of %d earlier run(s) in %s", removed, self.root)


def _open_folder(path: Path) -> int:
    """A descriptor of the folder ``path``, each component opened without following a link (refused)."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in path.parts[1:]:
            try:
                next_fd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except NotADirectoryError:
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise AdapterFileRefused(f"{path}: {part} turned into a symbolic link after the path was "
                                             "checked") from None
                raise
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _adapter_files(folder_fd: int, source: Path) -> list[str]:
    """The ``ADAPTER_FILES`` in the folder; refuses any link or special file in it (sub-folders are not read)."""
    names = []
    with os.scandir(folder_fd) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise AdapterFileRefused(f"{source / entry.name} is a symbolic link: an adapter folder must hold "
                                         "its files themselves")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise AdapterFileRefused(f"{source / entry.name} is not a regular file")
            if entry.name in ADAPTER_FILES and stat.S_ISREG(mode):
                names.append(entry.name)
    return names


def _copy(folder_fd: int, source: Path, target: Path) -> None:
    """Copy the file ``source`` (opened in the folder without following a link, checked to be regular)."""
    try:
        src = os.open(source.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:  # a file swapped for a link since the folder was listed
            raise AdapterFileRefused(f"{source} is a symbolic link: an adapter folder must hold its files "
                                     "themselves") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise AdapterFileRefused(f"{source} is not a regular file")
        with open(src, "rb", closefd=False) as reader, \
                open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), "wb") as writer:
            shutil.copyfileobj(reader, writer, COPY_CHUNK_BYTES)
    finally:
        os.close(src)
