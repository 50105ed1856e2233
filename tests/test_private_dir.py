"""``base.files.private_dir``: the folders the server writes are made mode 0700, and an existing one is
used only when no other user can control it (real folders under ``tmp_path``; the other-user cases
need root to ``chown``, and skip without it)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mia_engine.base.files import UnsafeFolder, atomic_dir, private_dir
from mia_engine.base.keys import KeyFileError, admin_key

OTHER_UID = 54321
"""A uid that is not this process's (used only where the tests run as root and can ``chown``)."""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_missing_folders_are_made_0700_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        made = private_dir(tmp_path / "a" / "b" / "c", "data_dir")
    finally:
        os.umask(previous)
    assert made.is_dir()
    assert [_mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", made)] == [0o700] * 3


def test_a_users_own_0755_folder_is_accepted_unless_exact(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    folder.chmod(0o755)
    assert private_dir(folder, "data_dir") == folder
    assert _mode(folder) == 0o755  # an operator's folder is not changed
    with pytest.raises(UnsafeFolder, match=r"^learner\.publish_tmpfs: .*data is open to other users \(mode 0755\); "
                                           r"run: chmod 700 "):
        private_dir(folder, "learner.publish_tmpfs", exact=True)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_folder_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UnsafeFolder) as refused:
        private_dir(folder, "data_dir")
    message = str(refused.value)
    assert message.startswith(f"data_dir: {folder} is open to other users (mode {mode:04o})") and "\n" not in message


def test_a_planted_link_is_refused_where_exact(tmp_path: Path) -> None:
    target = tmp_path / "attacker"
    target.mkdir(mode=0o700)
    link = tmp_path / "mia_engine-0-abc"
    link.symlink_to(target)
    with pytest.raises(UnsafeFolder, match=r"^learner\.publish_tmpfs: .* is a symbolic link, not a real folder; "
                                           r"remove it or set learner\.publish_tmpfs to a folder of your own$"):
        private_dir(link, "learner.publish_tmpfs", exact=True)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafeFolder):
        private_dir(dangling, "learner.publish_tmpfs", exact=True)
    assert not (tmp_path / "nowhere").exists()  # never created through the link


def test_a_users_own_link_is_followed_unless_exact(tmp_path: Path) -> None:
    disk = tmp_path / "big-disk"
    disk.mkdir(mode=0o700)
    link = tmp_path / "data"
    link.symlink_to(disk)
    assert private_dir(link, "data_dir") == link
    disk.chmod(0o777)  # the link is checked where it points
    with pytest.raises(UnsafeFolder, match="open to other users"):
        private_dir(link, "data_dir")


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("x")
    with pytest.raises(UnsafeFolder, match=r"^data_dir: .*data is not a folder"):
        private_dir(tmp_path / "data", "data_dir")


@needs_root
def test_another_users_folder_or_link_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeFolder, match=rf"belongs to another user \(uid {OTHER_UID}\)"):
        private_dir(theirs, "data_dir")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    os.lchown(link, OTHER_UID, OTHER_UID)  # their link to a folder of mine: they can repoint it
    with pytest.raises(UnsafeFolder, match=rf"symbolic link made by another user \(uid {OTHER_UID}\)"):
        private_dir(link, "data_dir")


def test_the_admin_key_is_not_written_into_a_folder_others_can_write(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    with pytest.raises(KeyFileError, match=r"^data_dir: .* is open to other users"):
        admin_key(data / "admin_api_key")
    assert list(data.iterdir()) == []


@pytest.mark.parametrize("admin_key_env", ["", "k" * 32], ids=["generated-key", "configured-key"])
def test_serve_refuses_a_data_dir_others_can_write_in_one_line(tmp_path: Path, admin_key_env: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    env = {**os.environ, "MIA_ADMIN_API_KEY": admin_key_env}
    done = subprocess.run([sys.executable, "-m", "mia_engine", "serve", "--config", "tiny", "--data-dir", str(data),
                           "--port", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (f"python -m mia_engine: error: data_dir: {data} is open to other "
                                                    f"users (mode 0777); run: chmod 700 {data}")
    assert list(data.iterdir()) == []


def test_a_folder_built_whole_gets_a_private_parent(tmp_path: Path) -> None:
    """The passage and image indexes are built under ``<data_dir>/tools/...`` by ``atomic_dir``, which made
    the missing parents with the umask's bits (0755); ``mkdir``'s ``mode`` reaches only the last one."""
    old_umask = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "data" / "tools" / "index" / "wiki-offline") as tmp:
            (tmp / "part").write_text("x")
    finally:
        os.umask(old_umask)
    for folder in ("data", "data/tools", "data/tools/index", "data/tools/index/wiki-offline"):  # every level
        assert stat.S_IMODE((tmp_path / folder).stat().st_mode) == 0o700, folder
