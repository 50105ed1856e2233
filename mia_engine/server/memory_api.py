"""HTTP routes of the Memory Manager under ``/v1/memory``, over a ``MemoryService`` (or the server's
``MemoryHandle``, asked for the service on each request: 503 until the store is open). The request and
response bodies are in ``memory_bodies.py``.

The stats (counts only) are open to the ``agent`` scope, whose answers draw on the memory, and to
``memory-read``; everything that returns stored questions (search, get, export) needs ``memory-read``, and
every write, import and delete ``memory-write`` (``security.py``): memories come only from keys that may write
them (adds, imports, ``learn: true``), so a chat or agent key cannot read every learned question. The agent's
own retrieval inside a request is not a route and is not affected. Every route takes a ``/v1/memory``
admission slot, which the export holds until its streamed body is sent. Each handler turns the store's own
errors into OpenAI-style error bodies itself, so the routes are correct mounted alone (behind the
``SecurityMiddleware``); the main app's exception handler then only sees what they did not anticipate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from ..config import AdmissionConfig, ServerConfig
from ..memory.embedder import EncoderBusy
from ..memory.entries import (AddResult, InvalidMemory, MemoryNotFound, MemoryStats, MemoryStoreError,
                              MemoryUnavailable, RecordTooLarge, StoredRecord)
from ..memory.handle import MemoryHandle
from ..memory.jsonl import decode_jsonl, encode_jsonl
from ..memory.service import MemoryService
from ..memory.validation import TextTooLong
from .admission import Admission
from .body import read_body, read_json
from .errors import APIError, BadRequest, NotFound, PayloadTooLarge, TooManyRequests, Unavailable
from .memory_bodies import (AddRequest, DeleteResponse, ImportResponse, MemoryView, SearchRequest, SearchResponse,
                            memory_view, search_response)
from .openapi import ApiRoute
from .responses import json_response

Handler = Callable[[Request], Awaitable[Response]]

_ADD = msgspec.json.Decoder(AddRequest)
_SEARCH = msgspec.json.Decoder(SearchRequest)


def memory_routes(memory: MemoryService | MemoryHandle, config: ServerConfig | None = None,
                  admission: Admission | None = None) -> list[BaseRoute]:
    """The ``/v1/memory`` routes; fixed paths come before ``/{memory_id}`` so they are never read as ids."""
    config = config or ServerConfig()
    handlers = _MemoryHandlers(memory, config)
    api = _Guard(admission or Admission(config.admission), config.admission)
    return [
        ApiRoute("/v1/memory/add", api(handlers.add), method="POST", summary="Store a workflow memory",
                 scope="memory-write", request_type=AddRequest, response_type=AddResult),
        ApiRoute("/v1/memory/search", api(handlers.search), method="POST", summary="Top memories of a question",
                 scope="memory-read", request_type=SearchRequest, response_type=SearchResponse),
        ApiRoute("/v1/memory/export", api(handlers.export), method="GET", summary="Every record, as JSON lines",
                 scope="memory-read", audit=True, media_type="application/x-ndjson"),
        ApiRoute("/v1/memory/import", api(handlers.import_), method="POST",
                 summary="Upsert exported records (JSON lines)", scope="memory-write", response_type=ImportResponse),
        ApiRoute("/v1/memory/stats", api(handlers.stats), method="GET", summary="Store summary",
                 scope=("memory-read", "agent"), response_type=MemoryStats),
        ApiRoute("/v1/memory/{memory_id}", api(handlers.get), method="GET", summary="One memory",
                 scope="memory-read", response_type=MemoryView),
        ApiRoute("/v1/memory/{memory_id}", api(handlers.delete), method="DELETE", summary="Delete a memory",
                 scope="memory-write", response_type=DeleteResponse),
    ]


class _MemoryHandlers:
    def __init__(self, memory: MemoryService | MemoryHandle, config: ServerConfig) -> None:
        self._memory = memory
        self._max_body_bytes = config.max_body_bytes

    def _service(self) -> MemoryService:
        """The open service (a handle raises ``MemoryUnavailable`` until it is open: the guard's 503)."""
        return self._memory.service if isinstance(self._memory, MemoryHandle) else self._memory

    async def add(self, request: Request) -> Response:
        return json_response(await self._service().add(await read_json(request, self._max_body_bytes, _ADD)))

    async def search(self, request: Request) -> Response:
        body: SearchRequest = await read_json(request, self._max_body_bytes, _SEARCH)
        result = await self._service().search(
            body.question,
            caption=body.caption,
            category=body.category,
            modality=body.modality,
            num_positive=body.num_positive,
            num_negative=body.num_negative,
        )
        return json_response(search_response(result))

    async def get(self, request: Request) -> Response:
        return json_response(memory_view(await self._service().get(request.path_params["memory_id"])))

    async def delete(self, request: Request) -> Response:
        memory_id = request.path_params["memory_id"]
        await self._service().delete(memory_id)
        return json_response(DeleteResponse(memory_id))

    async def export(self, request: Request) -> Response:
        records = await self._service().export_records()  # a consistent cut, encoded while streaming
        return StreamingResponse(encode_jsonl(records), media_type="application/x-ndjson")

    async def import_(self, request: Request) -> Response:
        body = await read_body(request, self._service().config.max_import_bytes)
        records = await decode_in_slices(body)
        return json_response(ImportResponse(await self._service().import_records(records)))

    async def stats(self, request: Request) -> Response:
        return json_response(await self._service().stats())


IMPORT_SLICE_BYTES = 128 * 1024
"""Bytes of an import decoded between two turns of the event loop (a few milliseconds of decoding)."""


async def decode_in_slices(data: bytes | bytearray) -> list[StoredRecord]:
    """``decode_jsonl`` over slices of about ``IMPORT_SLICE_BYTES`` cut at line ends, giving the event loop a
    turn between slices: a whole import (up to ``max_import_bytes``) would hold it for seconds. Decoded on
    the loop rather than in a thread, where the decoder's long native calls would hold the GIL anyway."""
    records: list[StoredRecord] = []
    start, line = 0, 1
    try:
        while start < len(data):
            end = data.find(b"\n", start + IMPORT_SLICE_BYTES)
            end = len(data) if end < 0 else end + 1
            piece = data[start:end]
            records += decode_jsonl(piece, first_line=line)
            line += piece.count(b"\n") + piece.count(b"\r") - piece.count(b"\r\n")  # as splitlines counts
            start = end
            await asyncio.sleep(0)
    except Exception:
        await release_in_slices(records)  # freeing 100k records at once would hold the loop as long
        raise
    return records


RELEASE_SLICE = 4096
"""Records freed between two turns of the event loop."""


async def release_in_slices(records: list) -> None:  # type: ignore[type-arg]
    """Empty ``records`` a slice at a time, giving the event loop a turn between slices."""
    while records:
        del records[-RELEASE_SLICE:]
        await asyncio.sleep(0)


class _Guard:
    """Admission plus the mapping of the store's errors to 4xx/503 bodies, around each handler."""

    def __init__(self, admission: Admission, config: AdmissionConfig) -> None:
        self._admission = admission
        self._limit = config.max_concurrent_memory
        self._retry_after_s = config.retry_after_s

    def __call__(self, handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                return await self._admitted(handler, request)
            except APIError as err:
                return err.to_response()
            except MemoryStoreError as err:
                return _store_error(err).to_response()
            except EncoderBusy as err:
                return TooManyRequests(str(err), retry_after_s=self._retry_after_s).to_response()

        return endpoint

    async def _admitted(self, handler: Handler, request: Request) -> Response:
        """``handler`` in a ``route:memory`` slot; a streamed answer (the export) keeps it until it is sent."""
        await self._admission.acquire(_KEY, self._limit)
        try:
            response = await handler(request)
        except BaseException:
            self._admission.release(_KEY)
            raise
        if isinstance(response, StreamingResponse):
            return self._admission.held_by(_KEY, response)
        self._admission.release(_KEY)
        return response


_KEY = "route:memory"


def _store_error(err: MemoryStoreError) -> APIError:
    if isinstance(err, MemoryNotFound):
        return NotFound(str(err), code="memory_not_found")
    if isinstance(err, RecordTooLarge):
        return PayloadTooLarge(str(err), code="record_too_large")
    if isinstance(err, InvalidMemory):
        return BadRequest(str(err), param=err.field if isinstance(err, TextTooLong) else None)
    if isinstance(err, MemoryUnavailable):
        return Unavailable(str(err), code="memory_not_ready")  # behind the API key: the reason helps operators
    return Unavailable("the memory store cannot serve this request (details are in the server log)",
                       code="memory_error")
