"""The access log (``server.access_log``): one line per HTTP request, through the server's logging setup
(``base/logs.py``: text or JSON), in place of uvicorn's.

uvicorn's access line holds the percent-decoded path as the client sent it (a ``%0A`` in it ends the line
and starts a forged one) and the whole query string. This one holds, once the response is done::

    127.0.0.1:52144 ops "POST /v1/chat/completions" 200 1532 B 84.1 ms

the client's address, the name of the API key it used (``scope["mia.key_name"]``, set by the security
middleware; ``-`` for none: never the key itself), the method and path escaped and bounded
(``base/log_text.printable``; no query string, where tokens travel), the status (500 where the app raised
before it answered), the body bytes sent and the time from the request's arrival until the app was done
with it (its last byte handed to the server).
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..base.log_text import printable

log = logging.getLogger(__name__)

KEY_NAME_SCOPE = "mia.key_name"
"""The scope entry that names the API key a request was let in with (the security middleware sets it)."""
MAX_METHOD_CHARS = 16
MAX_ADDRESS_CHARS = 64
"""Characters of the client's host logged at most (a proxy's forwarded header may set it)."""


class AccessLogMiddleware:
    """Logs every HTTP request once it ends (``log``, level info); other scopes pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = _Response(send)
        try:
            await self.app(scope, receive, response.send)
        finally:
            _log(scope, response)


class _Response:
    """What the app sent: its status (None until it started answering) and body bytes."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started_at = time.perf_counter()
        self.status: int | None = None
        self.num_bytes = 0

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.num_bytes += len(message.get("body", b""))
        await self._send(message)


def _log(scope: Scope, response: _Response) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    address = f"{printable(str(client[0]), MAX_ADDRESS_CHARS)}:{client[1]}" if client else "-"
    log.info('%s %s "%s %s" %d %d B %.1f ms', address, printable(str(scope.get(KEY_NAME_SCOPE) or "-")),
             printable(scope["method"], MAX_METHOD_CHARS), printable(scope["path"]),
             500 if response.status is None else response.status, response.num_bytes,
             (time.perf_counter() - response.started_at) * 1000)
