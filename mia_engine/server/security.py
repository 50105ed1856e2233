"""What keeps a browser, a stranger or a plain client out of what it must not drive.

One ASGI middleware, in front of every route:
- **Host check** (DNS rebinding): the ``Host`` header must name this server (``ServerConfig.allowed_hosts``;
  by default the loopback names and the bind address), else 400 ``invalid_host``. A non-loopback bind with an
  API key accepts any Host by default: clients and probes use the box's IP or DNS name, and the key, which a
  rebinding page cannot send, is the protection there.
- **JSON only**: a POST/PUT/PATCH must say ``Content-Type: application/json`` (the memory import also takes
  JSON lines), else 415. Those types are not "simple" in the CORS sense, so a cross-site page cannot send
  them without a preflight, which this server never grants.
- **Keys and scopes**: ``/v1``, ``/tokenize`` and ``/detokenize`` need ``Authorization: Bearer <api_key>`` when one is set; the admin key
  also opens the admin scope (adapters, learning, memory writes/imports/exports), which handlers demand
  with ``require_admin``. Only the admin key opens it, on loopback too and with no API key set (``serve``
  generates one where none is configured): another user of the machine must not change the model. On a
  keyed non-loopback bind ``/metrics`` and ``/openapi.json`` need the key too (``/health`` never does, so
  load balancers can probe it).
"""

from __future__ import annotations

import hmac
from typing import Literal

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import ServerConfig
from .errors import APIError, BadRequest, Forbidden, Unauthorized, UnsupportedMediaType

AuthScope = Literal["admin", "user"]
SCOPE_KEY = "mia.auth_scope"
JSON_TYPES = frozenset({"application/json", "application/x-ndjson", "application/jsonl"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


KEYED_PREFIXES = ("/v1", "/tokenize", "/detokenize")
"""Paths that need the API key when one is set: the API, and tokenisation, which costs the engines' CPU."""
PUBLIC_KEYED_PREFIXES = ("/metrics", "/openapi.json")
"""Paths that need the key too on a keyed non-loopback bind: what the server runs and how it is driven
is nobody's business but its clients' there (on loopback, local tools read them without a key)."""


def allowed_host_names(config: ServerConfig) -> frozenset[str]:
    """``allowed_hosts``, else ``*`` on a keyed non-loopback bind, else the loopback names and the bind address."""
    names = set(config.allowed_hosts) or ({"*"} if is_keyed_public(config) else {*LOOPBACK_NAMES, config.host})
    return frozenset(name.lower().strip("[]") for name in names)


def is_keyed_public(config: ServerConfig) -> bool:
    """A non-loopback bind guarded by ``api_key``: the key, not the Host header, keeps strangers out."""
    return bool(config.api_key) and not config.is_loopback()


def host_name(header: str) -> str:
    """``example.org:8000`` -> ``example.org``; ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class SecurityMiddleware:
    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.hosts = allowed_host_names(config)
        self.user_key = f"Bearer {config.api_key}".encode() if config.api_key else None
        self.admin_key = f"Bearer {config.admin_api_key}".encode() if config.admin_api_key else None
        self.keyed_prefixes = KEYED_PREFIXES + (PUBLIC_KEYED_PREFIXES if is_keyed_public(config) else ())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            headers = dict(scope["headers"])
            self._check_host(headers.get(b"host", b"").decode("latin-1"))
            self._check_content_type(scope["method"], headers.get(b"content-type", b"").decode("latin-1"))
            scope[SCOPE_KEY] = self._auth_scope(scope["path"], headers.get(b"authorization", b""))
        except APIError as err:
            await err.to_response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_host(self, header: str) -> None:
        if "*" not in self.hosts and host_name(header) not in self.hosts:
            raise BadRequest("The Host header does not name this server (see server.allowed_hosts).",
                             code="invalid_host")

    @staticmethod
    def _check_content_type(method: str, header: str) -> None:
        if method in _BODY_METHODS and header.split(";", 1)[0].strip().lower() not in JSON_TYPES:
            raise UnsupportedMediaType("Request bodies must be JSON: send 'Content-Type: application/json'.",
                                       code="unsupported_media_type")

    def _auth_scope(self, path: str, sent: bytes) -> AuthScope:
        if self.admin_key is not None and hmac.compare_digest(sent, self.admin_key):
            return "admin"
        if self.user_key is not None and hmac.compare_digest(sent, self.user_key):
            return "user"
        if self.user_key is not None and path.startswith(self.keyed_prefixes):
            raise Unauthorized("Missing or invalid API key (send 'Authorization: Bearer <key>').",
                               code="invalid_api_key")
        return "user"


def is_admin(request: Request) -> bool:
    """Whether the request authenticated with the admin key."""
    return request.scope.get(SCOPE_KEY) == "admin"


def require_admin(request: Request, what: str, *, param: str | None = None) -> None:
    """Refuse (403) unless the request authenticated with the admin key (none configured: always)."""
    if is_admin(request):
        return
    raise Forbidden(f"{what} needs the admin key (server.admin_api_key / MIA_ADMIN_API_KEY; where none is "
                    "set, the server generated one in the file admin_api_key of its data dir).", param=param,
                    code="admin_key_required")
