"""``GET /openapi.json``: the API described from the msgspec structs the routes decode and encode.

Every route is an ``ApiRoute``: the route carries its request and response types and the scope it needs
(``security.py``; ``build_app`` refuses a route without one), so the document is generated from the code
that validates, never written by hand. Schemas come from ``msgspec.json.schema_components``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .errors import APIError, ErrorBody
from .security import AUDITED_SCOPES, ROUTE_SCOPES, RouteScope, audit, require_scope

OPENAPI_VERSION = "3.1.0"
_REF = "#/components/schemas/{name}"
Handler = Callable[[Request], Awaitable[Response]]


class ApiRoute(Route):
    """A route with its contract: request body type, response type, the scope it needs, one-line summary.

    ``scope`` (required): ``public``, or the scope a key must open (several: any of them), else 403 before
    the handler runs; a handler checks what depends on the body itself (``security.require_scope``).
    ``audit``: log one ``mia_engine.audit`` line per request (default: for the ``admin``, ``learn`` and
    ``memory-write`` scopes)."""

    def __init__(self, path: str, endpoint: Handler, *, method: str, summary: str, scope: RouteScope | tuple[
                 RouteScope, ...], request_type: Any = None, response_type: Any = None,
                 media_type: str = "application/json", audit: bool | None = None) -> None:
        self.scopes: tuple[str, ...] = (scope,) if isinstance(scope, str) else tuple(scope)
        unknown = [s for s in self.scopes if s not in ROUTE_SCOPES]
        if not self.scopes or unknown:
            raise ValueError(f"{method} {path}: scope {scope!r} is not one of {', '.join(ROUTE_SCOPES)}")
        self.request_type = request_type
        self.response_type = response_type
        self.media_type = media_type
        self.summary = summary
        self.is_audited = not AUDITED_SCOPES.isdisjoint(self.scopes) if audit is None else audit
        guarded = endpoint if self.scopes == ("public",) else _scoped(endpoint, self.scopes, f"{method} {path}")
        super().__init__(path, _audited(guarded, summary) if self.is_audited else guarded, methods=[method])

    @property
    def method(self) -> str:
        return next(m for m in sorted(self.methods or ()) if m != "HEAD")


def _scoped(endpoint: Handler, scopes: tuple[str, ...], what: str) -> Handler:
    async def guarded(request: Request) -> Response:
        require_scope(request, scopes, what)
        return await endpoint(request)

    return guarded


def _audited(endpoint: Handler, action: str) -> Handler:
    async def audited(request: Request) -> Response:
        try:
            response = await endpoint(request)
        except APIError as err:
            audit(request, action, f"{err.status} {err.code or err.type}")
            raise
        except BaseException as err:
            audit(request, action, f"failed ({type(err).__name__})")
            raise
        audit(request, action, response.status_code)
        return response

    return audited


def unscoped(routes: Sequence[BaseRoute]) -> list[str]:
    """The routes of ``routes`` that declare no scope (anything not an ``ApiRoute``), as ``METHOD path``."""
    return [f"{','.join(sorted(getattr(r, 'methods', None) or ['?']))} {getattr(r, 'path', r)}"
            for r in routes if not isinstance(r, ApiRoute)]


def openapi_routes(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """``GET /openapi.json``: the document of ``routes``, encoded once (the routes do not change)."""
    return [ApiRoute("/openapi.json", OpenAPIHandler(routes).openapi, method="GET", scope="public",
                     summary="This document")]


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
        "security": [] if route.scopes == ("public",) else [{"bearer": []}],
        "x-mia-scopes": list(route.scopes),
    }
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
