"""The keys of ``server.keys_file`` as the server holds them, reloaded on SIGHUP.

A reload reads and checks the whole file, then replaces the table in one assignment: a request is matched
against the old table or the new one, never a mix, and requests already admitted are not touched (a key
removed stops opening new requests; those in flight finish). A file that cannot be used keeps the old table
and logs one error line. uvicorn handles only SIGINT and SIGTERM, so the app's lifespan installs the SIGHUP
handler (``reload_on_sighup``) on the serving loop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from ..base.key_table import KeyEntry, KeyTable, read_key_table
from ..base.keys import KeyFileError

log = logging.getLogger(__name__)
_BEARER = b"Bearer "


class KeyRing:
    """The current ``KeyTable`` of ``keys_file`` (empty where none is set)."""

    def __init__(self, keys_file: str = "") -> None:
        self.path = Path(keys_file).expanduser() if keys_file else None
        self.table = read_key_table(self.path) if self.path is not None else KeyTable()
        if self.path is not None:
            self._log_loaded("loaded")

    def find(self, authorization: bytes) -> KeyEntry | None:
        """The entry of the key an ``Authorization: Bearer <key>`` header sends, if any."""
        if not authorization.startswith(_BEARER) or not len(self.table):
            return None
        return self.table.find(authorization[len(_BEARER):].strip())

    def reload(self) -> bool:
        """Read the file again; on success the new table replaces the old one whole. False (the old table
        kept, one error line) where the file cannot be used."""
        if self.path is None:
            return False
        try:
            table = read_key_table(self.path)
        except KeyFileError as err:
            log.error("keys not reloaded, the %d loaded before stay: %s", len(self.table), err)
            return False
        self.table = table
        self._log_loaded("reloaded")
        return True

    async def reload_on_sighup(self) -> None:
        """Reload on every SIGHUP until cancelled (the app's lifespan runs it in the serving process). Where
        signals cannot be handled (a loop outside the main thread, as a test client's), keys reload never."""
        if self.path is None:
            return
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        except (NotImplementedError, RuntimeError, ValueError) as err:
            log.warning("keys: no SIGHUP reload in this process (%s)", err)
            return
        try:
            await asyncio.Event().wait()
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    def _log_loaded(self, verb: str) -> None:
        names = self.table.names()
        log.info("keys: %s %d key(s) from %s: %s", verb, len(names), self.path, ", ".join(names) or "(none)")
