"""Key files of several users (``server.keys_file``): hashed API keys, each with a name and its scopes.

TOML, one ``[[key]]`` table per key::

    [[key]]
    name = "alice"                       # in the access log and the audit lines, never the key
    sha256 = "9f86d0...<64 hex digits>"  # SHA-256 of the key, as sent after "Bearer "
    scopes = ["chat", "agent", "memory-read"]
    max_concurrent = 32                  # optional: this key's per-client bound (0: the admission default)

A request is matched by the SHA-256 of the bearer token it sends. A plain, fast hash is enough: the keys
are random (``keys add`` draws 32 bytes, ``secrets.token_urlsafe``), so nobody recovers one from its hash by
trying, and a slow password hash would cost every request its time while protecting nothing more. The file
holds no secret, but whoever can write it can add a key, so it is read with the checks of a key file
(``keys.read_private_file``: this user's, or root's, and writable by nobody else). Part of the config layer:
``check_keys`` validates the file before ``serve`` starts, the server reads it again on SIGHUP; ``keys add``,
``keys list`` and ``keys remove`` (``cli.py``) write and read it here.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from .files import fsync_dir
from .keys import KeyFileError, read_private_file

KeyScope = Literal["chat", "agent", "learn", "memory-read", "memory-write", "admin"]
SCOPES: tuple[KeyScope, ...] = ("chat", "agent", "learn", "memory-read", "memory-write", "admin")
"""What a key may be granted: raw roles (``chat``), the research agent (``agent``), learning (``learn``),
reading and writing the memory, and the admin routes (adapters, LoRA loading)."""
MAX_KEYS_FILE_BYTES = 1 << 20
"""Bytes of a keys file read at most (some thousands of keys)."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
"""A key's name: it goes into log lines and admission keys, so no spaces, quotes or line breaks."""
RESERVED_NAMES = frozenset({"api_key", "admin_api_key"})
"""The names the log gives ``server.api_key`` and ``server.admin_api_key``: no entry may pass for them."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TABLE_HEADER = re.compile(r"\[\[\s*key\s*\]\]\s*(#.*)?")
"""A line that opens a ``[[key]]`` table (stripped), a comment after it allowed."""


class KeyEntry(msgspec.Struct, frozen=True):
    """One user's key, as the server knows it (the key itself is never kept)."""

    name: str
    sha256: str
    """Lower-case hex SHA-256 of the key."""
    scopes: frozenset[str]
    max_concurrent: int = 0
    """Requests with a body in flight at once under this key; 0 = ``admission.max_concurrent_per_client``."""


class KeyTable:
    """The entries of one keys file, looked up by the hash of a presented key; immutable once built (a
    reload builds a new table)."""

    def __init__(self, entries: Iterable[KeyEntry] = ()) -> None:
        self._by_hash = {entry.sha256: entry for entry in entries}

    def find(self, key: bytes) -> KeyEntry | None:
        """The entry of ``key`` (the bearer token's bytes), if any."""
        return self._by_hash.get(hashlib.sha256(key).hexdigest())

    def names(self) -> list[str]:
        return sorted(entry.name for entry in self._by_hash.values())

    def __len__(self) -> int:
        return len(self._by_hash)


def read_key_table(path: Path, field: str = "server.keys_file") -> KeyTable:
    """The table of ``path``; ``KeyFileError`` (one line naming ``field``, the file and the entry) where the
    file is unsafe or invalid."""
    return KeyTable(_read(path, field)[1])


def list_keys(path: Path) -> list[KeyEntry]:
    """The entries of the keys file ``path``, in the file's order (``KeyFileError`` as ``read_key_table``)."""
    return _read(path, "--file")[1]


def _read(path: Path, field: str) -> tuple[bytes, list[KeyEntry]]:
    """The bytes of the keys file ``path`` and its checked entries."""
    data = read_private_file(field, path, MAX_KEYS_FILE_BYTES + 1)
    if len(data) > MAX_KEYS_FILE_BYTES:
        raise KeyFileError(f"{field}: {path} is larger than {MAX_KEYS_FILE_BYTES} bytes")
    return data, _parse(data, f"{field}: {path}")


def _parse(data: bytes, where: str) -> list[KeyEntry]:
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise KeyFileError(f"{where}: not TOML: {err}") from None
    return parse_entries(document, where)


def parse_entries(document: Mapping[str, Any], where: str) -> list[KeyEntry]:
    """The ``[[key]]`` tables of a parsed keys file, checked (unique names and hashes, known scopes)."""
    unknown = sorted(set(document) - {"key"})
    if unknown:
        raise KeyFileError(f"{where}: unknown table {unknown[0]!r} (the file holds [[key]] tables only)")
    tables = document.get("key", [])
    if not isinstance(tables, list):
        raise KeyFileError(f"{where}: 'key' must be an array of tables ([[key]])")
    entries: list[KeyEntry] = []
    for i, table in enumerate(tables):
        entry = _entry(table, f"{where}: key[{i}]")
        for seen in entries:
            if seen.name == entry.name:
                raise KeyFileError(f"{where}: key[{i}].name: {entry.name!r} is also the name of an earlier key")
            if seen.sha256 == entry.sha256:
                raise KeyFileError(f"{where}: key[{i}].sha256: the same key as {seen.name!r}")
        entries.append(entry)
    return entries


def _entry(table: Any, where: str) -> KeyEntry:
    if not isinstance(table, dict):
        raise KeyFileError(f"{where}: must be a table")
    unknown = sorted(set(table) - {"name", "sha256", "scopes", "max_concurrent"})
    if unknown:
        raise KeyFileError(f"{where}.{unknown[0]}: unknown field (name, sha256, scopes, max_concurrent)")
    name, digest = table.get("name"), table.get("sha256")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise KeyFileError(f"{where}.name: {name!r} is not a name (1-64 of A-Z a-z 0-9 _ . @ -, a letter or "
                           "digit first)")
    if name in RESERVED_NAMES:
        raise KeyFileError(f"{where}.name: {name!r} names server.{name} in the logs; choose another name")
    where = f"{where} ({name})"
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest.lower()):
        raise KeyFileError(f"{where}.sha256: must be the 64 hex digits of the key's SHA-256")
    return KeyEntry(name, digest.lower(), _scopes(table.get("scopes"), where),
                    _max_concurrent(table.get("max_concurrent", 0), where))


def _scopes(scopes: Any, where: str) -> frozenset[str]:
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise KeyFileError(f"{where}.scopes: must be a non-empty list of scopes among {', '.join(SCOPES)}")
    unknown = [scope for scope in scopes if scope not in SCOPES]
    if unknown:
        raise KeyFileError(f"{where}.scopes: unknown scope {unknown[0]!r} (choose from {', '.join(SCOPES)})")
    return frozenset(scopes)


def _max_concurrent(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KeyFileError(f"{where}.max_concurrent: must be an integer >= 0, got {value!r}")
    return value


def add_key(path: Path, name: str, scopes: Iterable[str], max_concurrent: int = 0) -> str:
    """Append a new random key named ``name`` to the keys file ``path`` (created mode 0600 where missing)
    and return the key: only its hash is written, so this is the one time it is seen. The file is
    rewritten whole through a private temporary sibling and a rename, so a server reloading it meanwhile
    reads the old file or the new one, never half of one; ``KeyFileError`` leaves it unchanged."""
    field = "--file"
    key = secrets.token_urlsafe(32)
    entry = _entry({"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest(), "scopes": list(scopes),
                    "max_concurrent": max_concurrent}, f"{field}: new key")
    old = read_private_file(field, path, MAX_KEYS_FILE_BYTES) if os.path.lexists(path) else b""
    new = old + (b"\n" if old and not old.endswith(b"\n") else b"") + (b"\n" if old.strip() else b"")
    new += _entry_text(entry).encode()
    _parse(new, f"{field}: {path}")  # e.g. the name is taken
    _replace(path, new)
    return key


def remove_key(path: Path, name: str) -> KeyEntry:
    """Remove the entry named ``name`` from the keys file ``path`` and return it; the other entries, and the
    comments above them, stay as they were written. The file is rewritten as ``add_key`` rewrites it;
    ``KeyFileError`` (no key of that name, say) leaves it unchanged."""
    field = "--file"
    old, entries = _read(path, field)
    index = next((i for i, entry in enumerate(entries) if entry.name == name), None)
    if index is None:
        names = ", ".join(entry.name for entry in entries) or "none"
        raise KeyFileError(f"{field}: {path}: no key named {name!r} (its keys: {names})")
    kept = entries[:index] + entries[index + 1:]
    new = _without_table(old.decode("utf-8"), index)
    if new is None or _parse(new.encode(), f"{field}: {path}") != kept:  # the tables not one plain [[key]] each
        new = "\n".join(_entry_text(entry) for entry in kept)
    _replace(path, new.encode())
    return entries[index]


def _without_table(text: str, index: int) -> str | None:
    """``text`` without its ``index``-th ``[[key]]`` table: from the comment lines right above its header to
    those above the next header, or to the end. None where ``text`` has fewer such headers; the caller checks
    the result, which a header inside a string or inline tables would make wrong."""
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if _TABLE_HEADER.fullmatch(line.strip())]
    if index >= len(headers):
        return None

    def block_start(header: int) -> int:
        while header > 0 and lines[header - 1].lstrip().startswith("#"):
            header -= 1
        return header

    end = block_start(headers[index + 1]) if index + 1 < len(headers) else len(lines)
    rest = "".join(lines[:block_start(headers[index])] + lines[end:]).rstrip()
    return rest + "\n" if rest else ""


def _entry_text(entry: KeyEntry) -> str:
    """The entry as a ``[[key]]`` table (its name and scopes are checked: nothing in them needs escaping)."""
    scopes = [scope for scope in SCOPES if scope in entry.scopes]
    lines = ["[[key]]", f'name = "{entry.name}"', f'sha256 = "{entry.sha256}"',
             "scopes = [" + ", ".join(f'"{scope}"' for scope in scopes) + "]"]
    if entry.max_concurrent:
        lines.append(f"max_concurrent = {entry.max_concurrent}")
    return "\n".join(lines) + "\n"


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
