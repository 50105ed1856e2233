"""The JSON answer of a route: a msgspec-encodable value as an ``application/json`` response."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")
