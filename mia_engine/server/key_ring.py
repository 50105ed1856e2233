"""The keys of ``server.keys_file`` as the server holds them, reloaded on SIGHUP.

A reload reads and checks the whole file, then replaces the table in one assignment: a request is matched
against the old table or the new one, never a mix, and requests already admitted are not touched (a key
removed stops opening new requests; those in flight finish). A file that cannot be used keeps the old table
and logs one error line. uvicorn handles only SIGINT and SIGTERM, so the app's lifespan installs the SIGHUP
handler (``reload_on_sighup``) on the serving loop. Before it, from the first moment of ``serve``
(``cli.main``), and again while the server stops, ``DeferredSighup`` handles the signal, whose default action
would end the process: a SIGHUP sent while the server starts (an operator who edited the keys file) is
recorded, and the ring reloads once for it when it takes over.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from types import FrameType

from ..base.key_table import KeyEntry, KeyTable, read_key_table
from ..base.keys import KeyFileError

log = logging.getLogger(__name__)
_BEARER = b"Bearer "


class DeferredSighup:
    """SIGHUP's handler in ``serve`` while the key ring's is not installed: it records the signal instead of
    letting Python's default action end the process. A Python-level handler rather than ``SIG_IGN``, which
    every process spawned from this one (vLLM's engine core and workers) would inherit across exec; a caught
    signal is reset to its default there. The ring finds it as the installed handler
    (``signal.getsignal``), where the process holds it: no module state."""

    def __init__(self) -> None:
        self.is_pending = False
        """A SIGHUP arrived that no reload has answered yet."""

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.is_pending = True

    @classmethod
    def install(cls) -> None:
        """Handle SIGHUP with a new ``DeferredSighup``; one already installed stays, with what it recorded.
        Outside the main thread (``cli.main`` called in another's), where Python cannot install a handler,
        nothing changes."""
        if isinstance(signal.getsignal(signal.SIGHUP), cls):
            return
        try:
            signal.signal(signal.SIGHUP, cls())
        except ValueError:
            return

    @classmethod
    def installed(cls) -> DeferredSighup | None:
        handler = signal.getsignal(signal.SIGHUP)
        return handler if isinstance(handler, cls) else None


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
        """Reload on every SIGHUP until cancelled (the app's lifespan runs it in the serving process), and
        once on taking over where a SIGHUP came while the server started (``DeferredSighup``, which gets
        the signal back when this is cancelled: a SIGHUP while the server stops does not end it halfway).
        Where signals cannot be handled (a loop outside the main thread, as a test client's), keys reload
        never; without a keys file, a SIGHUP stays recorded and does nothing."""
        if self.path is None:
            return
        loop, deferred = asyncio.get_running_loop(), DeferredSighup.installed()
        try:
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        except (NotImplementedError, RuntimeError, ValueError) as err:
            log.warning("keys: no SIGHUP reload in this process (%s)", err)
            return
        try:
            if deferred is not None and deferred.is_pending:
                deferred.is_pending = False
                log.info("keys: a SIGHUP came while the server started; reloading now")
                self.reload()
            await asyncio.Event().wait()
        finally:
            loop.remove_signal_handler(signal.SIGHUP)  # back to the default action, which ends the process
            if deferred is not None:
                signal.signal(signal.SIGHUP, deferred)

    def _log_loaded(self, verb: str) -> None:
        names = self.table.names()
        log.info("keys: %s %d key(s) from %s: %s", verb, len(names), self.path, ", ".join(names) or "(none)")
