"""``GET /openapi.json``: the API described from the msgspec structs the routes decode and encode.

Each route that has a body or a typed answer is an ``ApiRoute``: the route carries its request and
response types (and whether it needs the admin key), so the document is generated from the code that
validates, never written by hand. Schemas come from ``msgspec.json.schema_components``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .errors import ErrorBody
from .security import require_admin

OPENAPI_VERSION = "3.1.0"
_REF = "#/components/schemas/{name}"
Handler = Callable[[Request], Awaitable[Response]]


class ApiRoute(Route):
    """A route with its contract: request body type, response type, admin scope, one-line summary.

    ``is_admin`` routes refuse (403) a request that did not authenticate with the admin key."""

    def __init__(self, path: str, endpoint: Handler, *, method: str, summary: str, request_type: Any = None,
                 response_type: Any = None, media_type: str = "application/json", is_admin: bool = False) -> None:
        self.request_type = request_type
        self.response_type = response_type
        self.media_type = media_type
        self.is_admin = is_admin
        self.summary = summary
        super().__init__(path, _admin_only(endpoint, summary) if is_admin else endpoint, methods=[method])

    @property
    def method(self) -> str:
        return next(m for m in sorted(self.methods or ()) if m != "HEAD")


def _admin_only(endpoint: Handler, summary: str) -> Handler:
    async def guarded(request: Request) -> Response:
        require_admin(request, summary)
        return await endpoint(request)

    return guarded


def openapi_routes(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """``GET /openapi.json``: the document of ``routes``, encoded once (the routes do not change)."""
    return [Route("/openapi.json", OpenAPIHandler(routes).openapi, methods=["GET"])]


class OpenAPIHandler:
    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self._document = msgspec.json.encode(openapi_document(routes))

    async def openapi(self, request: Request) -> Response:
        return Response(self._document, media_type="application/json")


def openapi_document(routes: Sequence[BaseRoute], *, title: str = "MIA Engine", version: str = "1") -> dict:
    api_routes = [r for r in routes if isinstance(r, ApiRoute)]
    types = [ErrorBody, *(t for r in api_routes for t in (r.request_type, r.response_type) if t is not None)]
    types = list(dict.fromkeys(types))
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    schema_of = dict(zip(types, schemas))
    paths: dict[str, dict] = {}
    for route in api_routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, schema_of)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _operation(route: ApiRoute, schema_of: dict[Any, dict]) -> dict:
    error = {"content": {"application/json": {"schema": schema_of[ErrorBody]}}}
    ok: dict[str, Any] = {"description": "OK"}
    if route.response_type is not None:
        ok["content"] = {route.media_type: {"schema": schema_of[route.response_type]}}
    operation: dict[str, Any] = {
        "summary": route.summary,
        "responses": {"200": ok, "4XX": {"description": "OpenAI-style error", **error},
                      "5XX": {"description": "Not ready (503)", **error}},
        "security": [{"bearer": []}] if route.path.startswith("/v1") else [],
    }
    if route.is_admin:
        operation["x-admin-scope"] = True
    params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
              for name in route.param_convertors]
    if params:
        operation["parameters"] = params
    if route.request_type is not None:
        operation["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": schema_of[route.request_type]}}}
    return operation


def route_schema(route: ApiRoute) -> dict:
    """A standalone JSON schema (``$defs``) of a route's request body, e.g. for property-based tests."""
    return msgspec.json.schema(route.request_type)
