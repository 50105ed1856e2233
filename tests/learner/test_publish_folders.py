"""The learner's folders cannot be taken over by another user, and what a killed publish left behind is
removed at the next start: a folder or link planted at the predictable tmpfs name is refused, the
data dir's folders are made 0700, and staging folders of unfinished versions are deleted (the learner
and its files are real; the engine is the recording stand-in of ``test_ttl_durability``)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from mia_engine.base.files import UnsafeFolder
from mia_engine.learner.checkpoints import AdapterCheckpoints, publish_dir, publish_path, remove_staging
from mia_engine.config.learner import LearnerConfig

from .test_ttl_durability import _started

OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")


def _predicted(tmp_path: Path) -> tuple[LearnerConfig, Path, Path]:
    """A tmpfs stand-in, the config that publishes on it, and the folder name this instance would use
    there (found by asking once, then removed, as another user could compute it)."""
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    shm.chmod(0o1777)
    config, data = LearnerConfig(publish_tmpfs=str(shm)), tmp_path / "data" / "adapters" / "published"
    name = publish_dir(config, data, adapter_bytes=1)
    name.rmdir()
    return config, data, name


def test_a_link_planted_at_the_tmpfs_name_is_refused(tmp_path: Path) -> None:
    config, data, name = _predicted(tmp_path)
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    name.symlink_to(attacker)
    with pytest.raises(UnsafeFolder, match=rf"^learner\.publish_tmpfs: {name} is a symbolic link"):
        publish_dir(config, data, adapter_bytes=1)
    assert list(attacker.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o750])
def test_a_tmpfs_folder_with_group_or_other_bits_is_refused(tmp_path: Path, mode: int) -> None:
    config, data, name = _predicted(tmp_path)
    name.mkdir()
    name.chmod(mode)
    with pytest.raises(UnsafeFolder, match=rf"^learner\.publish_tmpfs: {name} is open to other users "
                                           rf"\(mode {mode:04o}\); run: chmod 700 {name}$"):
        publish_dir(config, data, adapter_bytes=1)
    name.chmod(0o700)  # the fix the message names
    assert publish_dir(config, data, adapter_bytes=1) == name


@needs_root
def test_a_tmpfs_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    config, data, name = _predicted(tmp_path)
    name.mkdir(mode=0o700)
    os.chown(name, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeFolder, match=rf"belongs to another user \(uid {OTHER_UID}\)"):
        publish_dir(config, data, adapter_bytes=1)


def test_an_operators_publish_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "pub"
    folder.mkdir()
    folder.chmod(0o777)
    config = LearnerConfig(publish_dir=str(folder))
    with pytest.raises(UnsafeFolder, match=r"^learner\.publish_dir: .* is open to other users \(mode 0777\)"):
        publish_dir(config, tmp_path / "data")
    folder.chmod(0o755)  # the operator's own folder at the usual mode
    assert publish_dir(config, tmp_path / "data") == folder


def test_the_data_dirs_folders_are_made_0700_and_checked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ckpt = AdapterCheckpoints(data / "adapters" / "planner", keep=2)
    published = publish_dir(LearnerConfig(), data / "adapters" / "published")
    role = publish_path(published, "planner", 1).parent
    for folder in (data, data / "adapters", ckpt.root, published, role):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    ckpt.root.chmod(0o775)
    with pytest.raises(UnsafeFolder, match=r"^data_dir: .*planner is open to other users \(mode 0775\)"):
        AdapterCheckpoints(ckpt.root, keep=2)


def _staging(role_dir: Path, version: int, num_bytes: int) -> Path:
    folder = role_dir / f".v{version}-{'a' * 32}.tmp-{'b' * 32}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * num_bytes)
    return folder


def test_staging_folders_a_killed_publish_left_are_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    role_dir = tmp_path / "pub" / "planner"
    stale = [_staging(role_dir, 3, 1000), _staging(role_dir, 4, 24)]
    published = role_dir / f"v2-{'c' * 32}"
    published.mkdir()
    other = role_dir / ".notes.tmp-x"  # not a name the learner writes
    other.mkdir()
    caplog.set_level("INFO", logger="mia_engine.learner.checkpoints")
    assert remove_staging(role_dir) == (2, 1024)
    assert not any(p.exists() for p in stale) and published.is_dir() and other.is_dir()
    assert "removed 2 unfinished adapter version(s)" in caplog.text
    assert remove_staging(tmp_path / "missing") == (0, 0)


def test_a_planted_link_with_a_staging_name_is_not_followed(tmp_path: Path) -> None:
    role_dir = tmp_path / "pub" / "planner"
    role_dir.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    (role_dir / f".v1-{'a' * 32}.tmp-{'b' * 32}").symlink_to(victim)
    assert remove_staging(role_dir) == (0, 0)
    assert (victim / "keep").exists()


def test_the_learner_removes_stale_staging_at_start(tiny: Path, tmp_path: Path) -> None:
    stale = _staging(tmp_path / "pub" / "planner", 7, 4096)
    ttl, registry, host = asyncio.run(_started(tiny, tmp_path))
    try:
        assert not stale.exists()
    finally:
        ttl.close()
