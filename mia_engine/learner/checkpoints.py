"""Where adapter versions live: fresh tmpfs folders for vLLM to load, durable copies for rollback.

Two places with two jobs. ``publish_path`` gives every version a new folder (vLLM caches adapters and
prefix-cache blocks by path, so a reused path would serve stale weights) on /dev/shm when possible, so
the update path never waits on a disk. ``AdapterCheckpoints`` keeps the last few published versions on
durable storage with a ``LATEST`` pointer to the latest good one: after a crash, or when a new version
misbehaves, the learner and the engine go back to it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from .config import LearnerConfig

SHM_DIR = Path("/dev/shm")
LATEST_FILE = "LATEST"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_PUBLISHED_DIR = re.compile(r"^v(\d+)-[0-9a-f]{32}$")


def publish_dir(config: LearnerConfig) -> Path:
    """The root for published adapters: ``config.publish_dir``, else /dev/shm/mia_engine, else a temp dir."""
    if config.publish_dir:
        root = Path(config.publish_dir)
    elif SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK):
        root = SHM_DIR / "mia_engine"
    else:
        root = Path(tempfile.gettempdir()) / "mia_engine"
    root.mkdir(parents=True, exist_ok=True)
    return root


def publish_path(root: Path, role: str, version: int) -> Path:
    """A new, not yet existing ``<root>/<role>/v{version}-{uuid}`` folder for one adapter version."""
    if not role or "/" in role or role.startswith("."):
        raise ValueError(f"invalid role name {role!r} for a publish path")
    role_dir = Path(root) / role
    role_dir.mkdir(parents=True, exist_ok=True)
    return role_dir / f"v{version}-{uuid.uuid4().hex}"


def prune_published(role_dir: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest published folders of a role (tmpfs is memory); returns them.

    Call it after the registry has retired the old versions: vLLM reads a folder only when loading it."""
    found = sorted((int(m.group(1)), p) for p in Path(role_dir).iterdir()
                   if p.is_dir() and (m := _PUBLISHED_DIR.match(p.name)))
    doomed = [path for _, path in found[:max(len(found) - keep, 0)]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


class AdapterCheckpoints:
    """Durable copies of published adapter versions under ``root/v{version:06d}`` plus ``root/LATEST``.

    Every write is a temp file or folder renamed into place, so a crash leaves either the old or the new
    state, never half a checkpoint. One owner per root (the learner of one role).
    """

    def __init__(self, root: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):  # left by a crash mid-write
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def path(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def versions(self) -> list[int]:
        """Saved versions, oldest first."""
        return sorted(int(m.group(1)) for p in self.root.iterdir()
                      if p.is_dir() and (m := _VERSION_DIR.match(p.name)))

    def save(self, version: int, src_dir: Path) -> Path:
        """Copy a published adapter folder in as ``version``, mark it the latest good one, prune."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            shutil.copytree(src_dir, tmp)
            _fsync_tree(tmp)
            target = self.path(version)
            if target.exists():  # a version number re-saved (e.g. after a restart): the new copy wins
                shutil.rmtree(target)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.mark_good(version)
        self._prune()
        return target

    def mark_good(self, version: int) -> None:
        """Point ``LATEST`` at a saved version (after a rollback, the one rolled back to)."""
        if not self.path(version).is_dir():
            raise FileNotFoundError(f"no checkpoint of version {version} in {self.root}")
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        with open(tmp, "w") as f:
            f.write(f"{version}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / LATEST_FILE)

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

    def _prune(self) -> None:
        """Keep the ``keep`` newest versions, and the latest good one whatever its age."""
        versions = self.versions()
        protected = set(versions[-self.keep:]) | {self.latest_version()}
        for version in versions:
            if version not in protected:
                shutil.rmtree(self.path(version), ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    """Flush the files of a copied folder before it is renamed into place."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
