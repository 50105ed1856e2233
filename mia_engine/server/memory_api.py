"""HTTP routes of the Memory Manager under ``/v1/memory``, over a ``MemoryService``.

Each handler turns ``APIError`` (and the store's own errors) into an OpenAI-style error body
itself, so the routes are correct mounted alone; the main app's exception handler then only
sees what these routes did not anticipate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from mia_engine.server.errors import APIError, BadRequest, NotFound, PayloadTooLarge, decode_body

from .entries import InvalidMemory, MemoryNotFound
from .jsonl import encode_jsonl
from .protocol import AddRequest, DeleteResponse, ImportResponse, SearchRequest, memory_view, search_response
from .service import MemoryService

Handler = Callable[[Request], Awaitable[Response]]

_ADD = msgspec.json.Decoder(AddRequest)
_SEARCH = msgspec.json.Decoder(SearchRequest)


def memory_routes(service: MemoryService) -> list[BaseRoute]:
    """The ``/v1/memory`` routes; fixed paths come before ``/{memory_id}`` so they are never read as ids."""
    handlers = _MemoryHandlers(service)
    return [
        Route("/v1/memory/add", _api(handlers.add), methods=["POST"]),
        Route("/v1/memory/search", _api(handlers.search), methods=["POST"]),
        Route("/v1/memory/export", _api(handlers.export), methods=["GET"]),
        Route("/v1/memory/import", _api(handlers.import_), methods=["POST"]),
        Route("/v1/memory/stats", _api(handlers.stats), methods=["GET"]),
        Route("/v1/memory/{memory_id}", _api(handlers.get), methods=["GET"]),
        Route("/v1/memory/{memory_id}", _api(handlers.delete), methods=["DELETE"]),
    ]


class _MemoryHandlers:
    def __init__(self, service: MemoryService) -> None:
        self._service = service

    async def add(self, request: Request) -> Response:
        body = decode_body(await request.body(), _ADD)
        return _json(await self._service.add(body))

    async def search(self, request: Request) -> Response:
        body: SearchRequest = decode_body(await request.body(), _SEARCH)
        result = await self._service.search(
            body.question,
            caption=body.caption,
            category=body.category,
            modality=body.modality,
            num_positive=body.num_positive,
            num_negative=body.num_negative,
        )
        return _json(search_response(result))

    async def get(self, request: Request) -> Response:
        return _json(memory_view(await self._service.get(request.path_params["memory_id"])))

    async def delete(self, request: Request) -> Response:
        memory_id = request.path_params["memory_id"]
        await self._service.delete(memory_id)
        return _json(DeleteResponse(memory_id))

    async def export(self, request: Request) -> Response:
        records = await self._service.export_records()  # a consistent cut, encoded while streaming
        return StreamingResponse(encode_jsonl(records), media_type="application/x-ndjson")

    async def import_(self, request: Request) -> Response:
        body = await _read_limited(request, self._service.config.max_import_bytes)
        return _json(ImportResponse(await self._service.import_jsonl(body)))

    async def stats(self, request: Request) -> Response:
        return _json(await self._service.stats())


def _api(handler: Handler) -> Handler:
    """Client mistakes become 4xx error bodies here, never 500s."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as err:
            return err.to_response()
        except MemoryNotFound as err:
            return NotFound(str(err), code="memory_not_found").to_response()
        except InvalidMemory as err:
            return BadRequest(str(err)).to_response()

    return endpoint


async def _read_limited(request: Request, max_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"import body exceeds {max_bytes} bytes", code="payload_too_large")
    return bytes(body)


def _json(value: object) -> Response:
    return Response(msgspec.json.encode(value), media_type="application/json")
