"""The JSON answer of a route: a msgspec-encodable value, or a body already encoded in parts, as an
``application/json`` response."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


class JSONPartsResponse(Response):
    """A JSON body sent as the parts it was encoded in, one ``send`` each, under its whole ``Content-Length``
    (not chunked): a body of many megabytes (n = 16 choices with log-probs) is never copied into one buffer,
    which would hold the event loop for as long as the copy and its page faults take."""

    media_type = "application/json"

    def __init__(self, parts: list[bytes], status_code: int = 200) -> None:
        self.parts, self.status_code, self.background = parts, status_code, None
        self.init_headers({"content-length": str(sum(len(part) for part in parts))})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for part in self.parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
