"""The one request-body reader of every route: a byte cap enforced while the body streams in, and the
JSON decoding that turns a body into a request struct.

A declared ``Content-Length`` over the cap is refused before anything is read; a chunked body (no
length) is counted chunk by chunk and refused as soon as it passes the cap, so no route ever holds
more than ``max_bytes`` (plus one chunk) of a client's body in memory. Routes call ``read_json`` (or
``read_body`` for a body that is not one JSON object, the memory import); nothing reads
``request.body()`` itself.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request

from .errors import BadRequest, PayloadTooLarge


def _too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body is larger than {max_bytes} bytes.", code="payload_too_large")


UTF8_DECODE_ERROR = "Invalid UTF-8"
"""What msgspec's DecodeError message says of a string that is not valid UTF-8."""


async def read_body(request: Request, max_bytes: int) -> bytearray:
    """The whole body, at most ``max_bytes``, in the buffer it was gathered in: not copied into ``bytes``,
    since one copy of a large import (up to ``max_import_bytes``) holds the event loop for tens of
    milliseconds."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest("Content-Length is not a number.")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
    return body


async def read_json(request: Request, max_bytes: int, decoder: msgspec.json.Decoder):  # type: ignore[type-arg]
    """A capped body decoded and validated into the decoder's struct (400 naming the field otherwise)."""
    return decode_body(await read_body(request, max_bytes), decoder)


def validation_param(err: msgspec.ValidationError) -> str | None:
    """Turn msgspec's ``... - at `$.messages[0].role``` into ``messages[0].role`` for the ``param`` field."""
    text = str(err)
    marker = " - at `$"
    if marker not in text:
        return None
    path = text.split(marker, 1)[1].rstrip("`")
    return path.lstrip(".") or None


def decode_body(body: bytes | bytearray, decoder: msgspec.json.Decoder):  # type: ignore[type-arg]
    """Decode and validate a JSON request body; any problem becomes a 400 that names the field (nesting too
    deep for the decoder included, so no body can raise past the route and cost the client its connection)."""
    if not body or body.isspace():  # strip() would copy the body
        raise BadRequest("Request body is empty; expected a JSON object.")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as err:
        raise BadRequest(f"Invalid request: {err}", param=validation_param(err)) from None
    except msgspec.DecodeError as err:
        if UTF8_DECODE_ERROR in str(err):  # a string the struct keeps (skipped ones are not read)
            raise BadRequest("Malformed JSON body: a string is not valid UTF-8.", code="invalid_utf8") from None
        raise BadRequest(f"Malformed JSON body: {err}") from None
    except RecursionError:  # msgspec's depth guard: the body nests deeper than the interpreter's stack allows
        raise BadRequest("Malformed JSON body: arrays and objects are nested too deeply.",
                         code="json_too_deep") from None
