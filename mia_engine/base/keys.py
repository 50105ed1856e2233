"""API key files: reading one an operator wrote, and the admin key ``serve`` generates at first start.

A key file must be a regular file of this user that no other user can read or write (mode 0600 or
tighter), as ssh demands of a private key: a key another user can read is theirs too. As PostgreSQL allows
for its TLS key, a file of root's that its group may read (0640 or tighter) is accepted too: that is how a
Kubernetes secret is mounted for a non-root container (``defaultMode: 0440`` with ``fsGroup``), and only
root or a member of the group the operator chose can read it. The generated admin
key (``ADMIN_KEY_FILE``, under the data dir) is created so, never followed through a link, and reused on
later starts. Part of the config layer for layering purposes: it imports only ``base.files``.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from .files import UnsafeFolder, fsync_dir, private_dir

MIN_KEY_CHARS = 16
"""Shortest API or admin key accepted: a short key is guessed by trying; a generated one has 43."""
ADMIN_KEY_FILE = "admin_api_key"
"""Name of the generated admin key's file in the data dir."""
MAX_KEY_FILE_BYTES = 4096
"""Bytes of a key file read at most (its first line is the key)."""


class KeyFileError(ValueError):
    """A key file that cannot be used: the message is one line naming the field and the fix."""


def read_key_file(field: str, path: Path, *, follow_links: bool = True) -> str:
    """The first line of ``path``, refused (``KeyFileError``) unless it is a regular file owned by this
    user with no group/other permission bits, or by root with at most group read. ``follow_links``: an
    operator's file may be a link (a mounted secret); the generated admin key's may not, and must be
    this user's."""
    data = read_private_file(field, path, MAX_KEY_FILE_BYTES, follow_links=follow_links)
    lines = data.decode("utf-8", errors="replace").splitlines()
    key = lines[0].strip() if lines else ""
    if not key:
        raise KeyFileError(f"{field}: {path} is empty")
    return key


def read_private_file(field: str, path: Path, max_bytes: int, *, follow_links: bool = True) -> bytes:
    """The first ``max_bytes`` of ``path``, with ``read_key_file``'s checks (``KeyFileError`` naming ``field``);
    the file is checked through the descriptor it is read from, so it cannot be swapped in between."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise KeyFileError(f"{field}: cannot read {path}: {err.strerror}") from None
    try:
        _check_private(field, path, os.fstat(fd), root_group_read=follow_links)
        chunks, size = [], 0
        while size < max_bytes and (chunk := os.read(fd, max_bytes - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check_private(field: str, path: Path, st: os.stat_result, *, root_group_read: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{field}: {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    roots = root_group_read and st.st_uid == 0
    if st.st_uid != os.geteuid() and not roots:
        raise KeyFileError(f"{field}: {path} belongs to another user (uid {st.st_uid}), who can change it; "
                           f"use a key file of your own, or of root's with mode 0640 or tighter")
    if mode & (0o037 if roots else 0o077):
        fix = f"chmod 640 {path} (a Kubernetes secret: defaultMode 0440 with fsGroup)" \
            if roots and os.geteuid() != 0 else f"chmod 600 {path}"
        raise KeyFileError(f"{field}: {path} is open to other users (mode {mode:04o}); run: {fix}")


def admin_key(path: Path, field: str = "server.admin_api_key") -> tuple[str, bool]:
    """The admin key kept in ``path``, and whether it was created now: a random one (mode 0600, the
    folder created 0700 where missing) on the first start, the same one on every later start."""
    try:
        private_dir(path.parent, "data_dir")  # another user's data dir would hold (or have planted) the key
    except UnsafeFolder as err:
        raise KeyFileError(str(err)) from None
    if os.path.lexists(path):
        return read_key_file(field, path, follow_links=False), False
    created = _create_key_file(path, secrets.token_urlsafe(32))
    return read_key_file(field, path, follow_links=False), created


def _create_key_file(path: Path, key: str) -> bool:
    """Write ``key`` to a private temporary sibling, then link it to ``path`` (atomic, and never over an
    existing file: two servers starting on one data dir share the first one's key). False: it existed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, f"{key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        tmp.unlink(missing_ok=True)
