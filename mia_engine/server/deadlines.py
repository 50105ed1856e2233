"""Read and write deadlines on every HTTP request, so a slow or stalled client cannot hold an admission slot.

A request's whole body must arrive within ``body_timeout_s`` of the first read (a client trickling a byte a
minute gets 408 and its connection closed, and its slots are freed). Once the response has started, each
send must complete within ``send_timeout_s``: a client that stops reading fills the socket buffers, and the
server's send then waits on flow control; past the deadline the request is abandoned (its generation
cancelled, its slots freed) and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..base.log_text import printable
from ..config import AdmissionConfig
from .errors import APIError

log = logging.getLogger(__name__)


class BodyTimeout(APIError):
    """The request body did not arrive within ``body_timeout_s``."""

    status = 408
    type = "timeout_error"


class SendTimeout(Exception):
    """The client read nothing for ``send_timeout_s`` while the server had a response to send."""


class _Deadlines:
    """One request's ``receive`` and ``send`` under the deadlines."""

    def __init__(self, receive: Receive, send: Send, config: AdmissionConfig) -> None:
        self._receive, self._send, self._config = receive, send, config
        self._body_deadline: float | None = None
        self._is_body_read = False
        self.is_body_expired = False
        self.is_send_expired = False

    async def receive(self) -> Message:
        if self._is_body_read:
            return await self._receive()
        if self._body_deadline is None:  # the clock starts when the route reads, not while the request queues
            self._body_deadline = asyncio.get_running_loop().time() + self._config.body_timeout_s
        try:
            async with asyncio.timeout_at(self._body_deadline):
                message = await self._receive()
        except TimeoutError:
            self.is_body_expired = True
            raise BodyTimeout(f"The request body did not arrive within {self._config.body_timeout_s:g} s "
                              "(server.admission.body_timeout_s).", code="body_timeout") from None
        self._is_body_read = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self.is_body_expired:
            # the rest of the body may still trickle in: end the connection rather than parse it
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        try:
            async with asyncio.timeout(self._config.send_timeout_s):
                await self._send(message)
        except TimeoutError:
            self.is_send_expired = True
            raise SendTimeout from None


class DeadlineMiddleware:
    """Puts every HTTP request under ``body_timeout_s`` and ``send_timeout_s``. A request abandoned for its
    send deadline returns without finishing its response, on which the server closes the connection."""

    def __init__(self, app: ASGIApp, config: AdmissionConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadlines = _Deadlines(receive, send, self.config)
        try:
            await self.app(scope, deadlines.receive, deadlines.send)
        except Exception:
            if not deadlines.is_send_expired:
                raise
            client = scope.get("client") or ("?", 0)
            log.warning("%s %s from %s abandoned: the client read nothing for %g s "
                        "(server.admission.send_timeout_s)", printable(scope["method"], 16),
                        printable(scope["path"]), printable(str(client[0]), 64), self.config.send_timeout_s)
