"""What keeps a browser, a stranger or a plain client out of what it must not drive.

One ASGI middleware, in front of every route:
- **Host check** (DNS rebinding): the ``Host`` header must name this server (``ServerConfig.allowed_hosts``;
  by default the loopback names and the bind address), else 400 ``invalid_host``. A non-loopback bind with an
  API key accepts any Host by default: clients and probes use the box's IP or DNS name, and the key, which a
  rebinding page cannot send, is the protection there.
- **JSON only**: a POST/PUT/PATCH must say ``Content-Type: application/json`` (the memory import also takes
  JSON lines), else 415. Those types are not "simple" in the CORS sense, so a cross-site page cannot send
  them without a preflight, which this server never grants.
- **Keys and scopes**: ``/v1``, ``/tokenize`` and ``/detokenize`` need ``Authorization: Bearer <key>`` on a keyed
  server (``api_key`` or ``keys_file`` set). The middleware puts what the key opens in the request's scope
  (``mia.auth_scopes``) and its name (``mia.key_name``: a ``keys_file`` entry's name, ``api_key`` or
  ``admin_api_key``, empty for none; never the key) for the routes, the access log and the audit lines.
  ``api_key`` opens ``chat`` and ``agent`` (so does any request on a server with no key configured);
  ``admin_api_key`` opens every scope, on loopback too and with no API key set (``serve`` generates one
  where none is configured): another user of the machine must not change the model. A ``keys_file`` key
  opens its entry's scopes. Each route declares the scopes it needs (``openapi.ApiRoute``), and handlers
  check what depends on the body (model ``mia``: ``agent``; ``learn: true``: ``learn``) with
  ``require_scope``: 403 ``insufficient_scope`` naming the scope. On a keyed non-loopback bind ``/metrics``
  and ``/openapi.json`` need a key too (``/health`` never does, so load balancers can probe it).
- **Audit**: every route in the ``admin``, ``learn`` and ``memory-write`` scopes (and the memory export)
  logs one line on the ``mia_engine.audit`` logger: the key's name, the request, the outcome.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from typing import Literal

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..base.key_table import SCOPES, KeyEntry
from ..base.log_text import printable
from ..config import ServerConfig
from .errors import APIError, BadRequest, Forbidden, Unauthorized, UnsupportedMediaType
from .key_ring import KeyRing

RouteScope = Literal["public", "chat", "agent", "learn", "memory-read", "memory-write", "admin"]
"""What a route needs: ``public`` (nothing), or a scope a key may open (``base.key_table.SCOPES``)."""
ROUTE_SCOPES: tuple[str, ...] = ("public", *SCOPES)
SCOPES_KEY = "mia.auth_scopes"
"""ASGI scope key: the frozenset of scopes the request's key opens."""
KEY_NAME_KEY = "mia.key_name"
"""ASGI scope key: the name of the request's key (``""``: none), for the access log and the audit lines."""
KEY_ENTRY_KEY = "mia.key_entry"
"""ASGI scope key: the ``KeyEntry`` of a ``keys_file`` key (absent for the other keys), for admission."""
API_KEY_NAME, ADMIN_KEY_NAME = "api_key", "admin_api_key"
API_KEY_SCOPES = frozenset({"chat", "agent"})
"""What ``api_key`` opens, and any request where no key is configured: the roles, the research agent, and
through it the memory stats (a route open to ``agent``); not the stored questions nor any write."""
ADMIN_SCOPES = frozenset(SCOPES)
AUDITED_SCOPES = frozenset({"admin", "learn", "memory-write"})
"""Routes in these scopes log one audit line per request."""
audit_log = logging.getLogger("mia_engine.audit")
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
    """A non-loopback bind guarded by keys (``api_key``, ``keys_file``): they, not the Host header, keep
    strangers out."""
    return config.is_keyed() and not config.is_loopback()


def host_name(header: str) -> str:
    """``example.org:8000`` -> ``example.org``; ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class SecurityMiddleware:
    def __init__(self, app: ASGIApp, config: ServerConfig, keys: KeyRing | None = None) -> None:
        self.app = app
        self.hosts = allowed_host_names(config)
        self.user_key = f"Bearer {config.api_key}".encode() if config.api_key else None
        self.admin_key = f"Bearer {config.admin_api_key}".encode() if config.admin_api_key else None
        self.keys = keys if keys is not None else KeyRing(config.keys_file)
        """The ``keys_file`` table, replaced as a whole on SIGHUP (``key_ring.py``)."""
        self.is_keyed = config.is_keyed()
        self.keyed_prefixes = KEYED_PREFIXES + (PUBLIC_KEYED_PREFIXES if is_keyed_public(config) else ())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            headers = dict(scope["headers"])
            self._check_host(headers.get(b"host", b"").decode("latin-1"))
            self._check_content_type(scope["method"], headers.get(b"content-type", b"").decode("latin-1"))
            name, scopes, entry = self._authenticate(scope["path"], headers.get(b"authorization", b""))
        except APIError as err:
            await err.to_response()(scope, receive, send)
            return
        scope[SCOPES_KEY], scope[KEY_NAME_KEY] = scopes, name
        if entry is not None:
            scope[KEY_ENTRY_KEY] = entry
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

    def _authenticate(self, path: str, sent: bytes) -> tuple[str, frozenset[str], KeyEntry | None]:
        """The name, scopes and ``keys_file`` entry of the key ``sent`` (the ``Authorization`` header); 401
        on a keyed path of a keyed server without a valid key."""
        if self.admin_key is not None and hmac.compare_digest(sent, self.admin_key):
            return ADMIN_KEY_NAME, ADMIN_SCOPES, None
        if self.user_key is not None and hmac.compare_digest(sent, self.user_key):
            return API_KEY_NAME, API_KEY_SCOPES, None
        entry = self.keys.find(sent)
        if entry is not None:
            return entry.name, entry.scopes, entry
        if self.is_keyed and path.startswith(self.keyed_prefixes):
            raise Unauthorized("Missing or invalid API key (send 'Authorization: Bearer <key>').",
                               code="invalid_api_key")
        return "", frozenset() if self.is_keyed else API_KEY_SCOPES, None


def request_scopes(request: Request) -> frozenset[str]:
    """The scopes the request's key opens; routes mounted without the middleware (tests) get what a server
    with no key configured gives every request."""
    return request.scope.get(SCOPES_KEY, API_KEY_SCOPES)


def key_name(request: Request) -> str:
    return request.scope.get(KEY_NAME_KEY, "")


def is_admin(request: Request) -> bool:
    """Whether the request's key opens the admin scope (the admin key, or a ``keys_file`` key with it)."""
    return "admin" in request_scopes(request)


def require_scope(request: Request, scope: str | Iterable[str], what: str, *, param: str | None = None) -> None:
    """Refuse (403 ``insufficient_scope``) unless the request's key opens ``scope`` (one of them, for several)."""
    needed = (scope,) if isinstance(scope, str) else tuple(scope)
    if "public" in needed or not request_scopes(request).isdisjoint(needed):
        return
    name = key_name(request)
    holder = f"the key {name!r}" if name else "a request without a key"
    scopes = " or ".join(repr(s) for s in needed)
    raise Forbidden(f"{what} needs the scope {scopes}, which {holder} does not open: use a key of server.keys_file "
                    "with it, or the admin key (server.admin_api_key / MIA_ADMIN_API_KEY; where none is set, the "
                    "server generated one in the file admin_api_key of its data dir).", param=param,
                    code="insufficient_scope")


def audit(request: Request, action: str, outcome: int | str) -> None:
    """One line on ``mia_engine.audit``: who (the key's name, never the key) did what, with what outcome."""
    audit_log.info("key %r: %s %s (%s): %s", key_name(request), printable(request.method, 16),
                   printable(request.url.path), action, outcome)
