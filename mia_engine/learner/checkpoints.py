"""Where adapter versions live: fresh folders for vLLM to load, durable copies for rollback.

Two places with two jobs. ``publish_path`` gives every version a new folder (vLLM caches adapters and
prefix-cache blocks by path, so a reused path would serve stale weights) under ``publish_dir``: the data
dir by default (private to this instance), or a tmpfs (no disk write on the update path) only when it is
configured, has room for the versions kept, and gets a folder of its own for this instance (mode 0700,
refused when another user made it first: ``base.files.private_dir``). A version is written into a
``.v<n>-<id>.tmp-<id>`` staging sibling and renamed into place; the staging folders a killed process
left behind (RAM, on a tmpfs) are removed when the learner starts (``remove_staging``).
``AdapterCheckpoints`` keeps the last few published versions on durable storage with a ``LATEST`` pointer
to the latest good one: after a crash, or when a new version misbehaves, the learner and the engine go
back to it. Version numbers only grow, across restarts too: a save never replaces an existing folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import stat
import uuid
import weakref
from collections.abc import Iterable
from pathlib import Path

from ..base.files import atomic_dir, private_dir, write_file_atomic
from ..config.learner import LearnerConfig

log = logging.getLogger(__name__)

LATEST_FILE = "LATEST"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_PUBLISHED_DIR = re.compile(r"^v(\d+)-[0-9a-f]{32}$")
_STAGING_DIR = re.compile(r"^\.v\d+-[0-9a-f]{32}\.tmp-[0-9a-f]{32}$")
"""A published version's staging folder (``learner.save_adapter``), renamed into place once written."""
_TMPFS_HEADROOM = 2
"""Published versions beyond ``num_checkpoints_kept`` a tmpfs must have room for (the one being written
and one draining)."""


def publish_dir(config: LearnerConfig, data_root: Path, adapter_bytes: int = 0) -> Path:
    """The root for published adapters: ``publish_dir``; else a private folder on ``publish_tmpfs`` when
    it has room for the kept versions; else ``data_root`` (under the data dir). Each is created mode 0700
    or checked (``UnsafeFolder``): the tmpfs folder, at a predictable name in a folder every user can
    write, must be a real folder of this user's with mode 0700 exactly; an operator's ``publish_dir`` and
    the data dir's folder must be this user's and writable by no other (``base.files.private_dir``)."""
    if config.publish_dir:
        return private_dir(Path(config.publish_dir).expanduser(), "learner.publish_dir")
    if config.publish_tmpfs:
        tmpfs = Path(config.publish_tmpfs)
        needed = adapter_bytes * (config.num_checkpoints_kept + _TMPFS_HEADROOM)
        if tmpfs.is_dir() and os.access(tmpfs, os.W_OK) and shutil.disk_usage(tmpfs).free >= needed:
            tag = hashlib.sha256(str(Path(data_root).resolve()).encode()).hexdigest()[:16]
            return private_dir(tmpfs / f"mia_engine-{os.geteuid()}-{tag}", "learner.publish_tmpfs", exact=True)
        log.warning("learner.publish_tmpfs %s lacks %d MiB for %d adapter versions: publishing under %s",
                    tmpfs, needed >> 20, config.num_checkpoints_kept + _TMPFS_HEADROOM, data_root)
    return private_dir(Path(data_root), "data_dir")


def publish_path(root: Path, role: str, version: int) -> Path:
    """A new, not yet existing ``<root>/<role>/v{version}-{uuid}`` folder for one adapter version."""
    if not role or "/" in role or role.startswith("."):
        raise ValueError(f"invalid role name {role!r} for a publish path")
    role_dir = private_dir(Path(root) / role, "learner.publish_dir")
    return role_dir / f"v{version}-{uuid.uuid4().hex}"


def remove_staging(role_dir: Path) -> tuple[int, int]:
    """Delete the staging folders of unfinished versions in a role's publish folder, as a process killed
    mid-write leaves them (on a tmpfs they hold RAM until removed); returns (folders, bytes) freed. Call it
    when the learner starts, before it writes: one learner writes a role's publish folder, so every
    staging folder there is dead. Only names this module writes, owned by this user, are touched."""
    role_dir = Path(role_dir)
    doomed = [path for path in role_dir.iterdir() if _is_own_staging(path)] if role_dir.is_dir() else []
    num_bytes = sum(_num_bytes(path) for path in doomed)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    if doomed:
        log.info("removed %d unfinished adapter version(s) in %s left by an earlier process (%.1f MiB)",
                 len(doomed), role_dir, num_bytes / 2**20)
    return len(doomed), num_bytes


def _is_own_staging(path: Path) -> bool:
    if not _STAGING_DIR.match(path.name):
        return False
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()  # lstat: never a link's target


def _num_bytes(folder: Path) -> int:
    """Bytes of the files below ``folder`` (links not followed)."""
    return sum(os.lstat(os.path.join(top, name)).st_size for top, _, names in os.walk(folder) for name in names)


def prune_published(role_dir: Path, keep: int, protected: Iterable[Path] = ()) -> list[Path]:
    """Delete all but the ``keep`` newest published folders of a role; returns them. ``protected``
    folders (the live and draining versions: vLLM re-reads a folder when it reloads an evicted adapter)
    are never deleted, whatever their number."""
    keep_paths = {Path(p).resolve() for p in protected}
    found = sorted((int(m.group(1)), p) for p in Path(role_dir).iterdir()
                   if p.is_dir() and (m := _PUBLISHED_DIR.match(p.name)))
    doomed = [path for _, path in found[:max(len(found) - keep, 0)] if path.resolve() not in keep_paths]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


class AdapterCheckpoints:
    """Durable copies of published adapter versions under ``root/v{version:06d}`` plus ``root/LATEST``.

    Every write is a temp file or folder renamed into place, so a crash leaves either the old or the new
    state, never half a checkpoint. One owner per root (the learner of one role): the first instance locks
    the root (``flock`` on the folder, held until ``close`` or exit) and only the holder removes the ``.tmp-*``
    a crash left, so a second server started on the same data dir (refused later, when it opens the
    memory store) never deletes a checkpoint the first one is writing.
    """

    def __init__(self, root: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        private_dir(self.root, "data_dir")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        self._release = weakref.finalize(self, os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:  # BlockingIOError: another instance holds it
            log.warning("%s is in use by another learner (%s): its unfinished checkpoints are left alone",
                        self.root, err)
            return
        for stale in self.root.glob(".tmp-*"):  # left by a crash mid-write: only the lock's holder writes here
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def close(self) -> None:
        """Release the root's lock (also done when the instance is collected)."""
        self._release()

    def path(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def versions(self) -> list[int]:
        """Saved versions, oldest first."""
        return sorted(int(m.group(1)) for p in self.root.iterdir()
                      if p.is_dir() and (m := _VERSION_DIR.match(p.name)))

    def next_version(self) -> int:
        """One past the newest version ever kept here (0 for an empty root): numbers continue across
        restarts, so a new save never meets an existing folder."""
        return max(self.versions(), default=-1) + 1

    def save(self, version: int, src_dir: Path, protected: Iterable[Path] = ()) -> Path:
        """Copy a published adapter folder in as ``version``, mark it the latest good one, prune (never a
        folder in ``protected``: the live and draining versions). An existing version is never replaced."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        target = self.path(version)
        if target.exists():
            raise FileExistsError(f"{target} exists; checkpoint versions are never reused")
        # the rename fails rather than replace if a folder appeared meanwhile
        with atomic_dir(target, tmp=self.root / f".tmp-{uuid.uuid4().hex}", durable=True) as tmp:
            shutil.copytree(src_dir, tmp, dirs_exist_ok=True)
        self.mark_good(version)
        self._prune(protected)
        return target

    def mark_good(self, version: int) -> None:
        """Point ``LATEST`` at a saved version (after a rollback, the one rolled back to)."""
        if not self.path(version).is_dir():
            raise FileNotFoundError(f"no checkpoint of version {version} in {self.root}")
        write_file_atomic(self.root / LATEST_FILE, f"{version}\n".encode(), tmp=self.root / f".tmp-{uuid.uuid4().hex}")

    def latest_version(self) -> int | None:
        """The version ``LATEST`` names, if it is still on disk."""
        try:
            version = int((self.root / LATEST_FILE).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return version if self.path(version).is_dir() else None

    def latest(self) -> Path | None:
        """The folder of the latest good version, or None when there is none."""
        version = self.latest_version()
        return None if version is None else self.path(version)

    def previous(self, version: int) -> Path | None:
        """The newest saved version older than ``version`` (the rollback target), or None."""
        older = [v for v in self.versions() if v < version]
        return self.path(older[-1]) if older else None

    def _prune(self, protected: Iterable[Path] = ()) -> None:
        """Keep the ``keep`` newest versions, the latest good one whatever its age, and any protected."""
        versions = self.versions()
        kept_paths = {Path(p).resolve() for p in protected}
        kept = set(versions[-self.keep:]) | {self.latest_version()}
        for version in versions:
            if version not in kept and self.path(version).resolve() not in kept_paths:
                shutil.rmtree(self.path(version), ignore_errors=True)
