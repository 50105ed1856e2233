"""``/v1/adapters``: the adapter versions each role serves, and publishing a new one from disk.

Publishing loads a PEFT folder that is already on the server's disk (the learner writes them; an
operator can too) as the role's next version: new requests use it at once, running ones finish on
theirs. The listing asks the engines which data-parallel replicas hold each version (a published
version must be on every replica of its role's engine). Listing needs the API key; publishing needs
the admin key and an admin admission slot.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..config import ServerConfig
from ..engines.adapters import AdapterError, AdapterRegistry, AdapterVersion
from .admission import Admission
from .body import read_json
from .errors import BadRequest, NotFound
from .openapi import ApiRoute

log = logging.getLogger(__name__)


class PublishRequest(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    """A PEFT adapter folder on the server's disk."""


class AdapterInfo(msgspec.Struct):
    role: str
    version: int
    lora_id: int
    path: str
    in_flight: int
    is_live: bool
    """False for a replaced version that still finishes its in-flight requests."""
    loaded_replicas: list[int] | None = None
    """The data-parallel replicas (ranks) of the role's engine that hold this version; None when the
    engine did not answer (it is stopping or dead)."""
    num_replicas: int | None = None
    """The data-parallel replicas of the role's engine; None when the engine did not answer."""


def _info(v: AdapterVersion, loaded: list[set[int]] | None = None) -> AdapterInfo:
    replicas = None if loaded is None else [rank for rank, ids in enumerate(loaded) if v.lora_id in ids]
    return AdapterInfo(v.role, v.version, v.lora_id, str(v.path), v.in_flight, not v.is_retired, replicas,
                       None if loaded is None else len(loaded))


async def _loaded_by_role(registry: AdapterRegistry, roles: set[str]) -> dict[str, list[set[int]] | None]:
    """Each role's ``AdapterRegistry.loaded_loras``, one engine query per role; None for an engine that
    did not answer, so the listing still shows what the registry knows."""
    loaded: dict[str, list[set[int]] | None] = {}
    for role in sorted(roles):
        try:
            loaded[role] = await registry.loaded_loras(role)
        except Exception as err:  # an engine that is stopping or dead: vLLM raises assorted errors
            log.warning("could not list the adapters loaded on %s's engine: %s", role, err)
            loaded[role] = None
    return loaded


class AdapterList(msgspec.Struct):
    data: list[AdapterInfo]
    object: str = "list"


def adapter_routes(registry: AdapterRegistry, config: ServerConfig | None = None,
                   admission: Admission | None = None) -> list[BaseRoute]:
    config = config or ServerConfig()
    admission = admission or Admission(config.admission)
    decoder = msgspec.json.Decoder(PublishRequest)

    async def list_adapters(request: Request) -> Response:
        versions = registry.versions()
        loaded = await _loaded_by_role(registry, {v.role for v in versions})
        infos = [_info(v, loaded[v.role]) for v in versions]
        return Response(msgspec.json.encode(AdapterList(infos)), media_type="application/json")

    async def publish(request: Request) -> Response:
        role = request.path_params["role"]
        if registry.current(role) is None:
            raise NotFound(f"Role `{role}` has no adapter.", param="role")
        body: PublishRequest = await read_json(request, config.max_body_bytes, decoder)
        if not body.path or "\x00" in body.path:
            raise BadRequest("path must be a non-empty folder path without NUL characters.", param="path")
        async with admission.slot("route:admin", config.admission.max_concurrent_admin):
            try:
                version = await registry.publish(role, Path(body.path))
            except AdapterError as err:
                raise BadRequest(str(err), param="path") from None
            except (OSError, ValueError) as err:  # a path the OS refuses (too long, bad bytes, ...)
                raise BadRequest(f"path cannot be read: {type(err).__name__}", param="path") from None
        loaded = await _loaded_by_role(registry, {role})
        return Response(msgspec.json.encode(_info(version, loaded[role])), media_type="application/json")

    return [
        ApiRoute("/v1/adapters", list_adapters, method="GET", summary="Adapter versions served",
                 response_type=AdapterList),
        ApiRoute("/v1/adapters/{role}", publish, method="POST", summary="Publish a PEFT folder as the role's next "
                 "version", request_type=PublishRequest, response_type=AdapterInfo, is_admin=True),
    ]
