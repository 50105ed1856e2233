"""``/v1/adapters``: the adapter versions each role serves, and publishing a new one from disk.

Publishing loads a PEFT folder that is already on the server's disk (the learner writes them; an
operator can too) as the role's next version: new requests use it at once, running ones finish on
theirs. Listing needs the API key; publishing needs the admin key and an admin admission slot.
"""

from __future__ import annotations

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


def _info(v: AdapterVersion) -> AdapterInfo:
    return AdapterInfo(v.role, v.version, v.lora_id, str(v.path), v.in_flight, not v.is_retired)


class AdapterList(msgspec.Struct):
    data: list[AdapterInfo]
    object: str = "list"


def adapter_routes(registry: AdapterRegistry, config: ServerConfig | None = None,
                   admission: Admission | None = None) -> list[BaseRoute]:
    config = config or ServerConfig()
    admission = admission or Admission(config.admission)
    decoder = msgspec.json.Decoder(PublishRequest)

    async def list_adapters(request: Request) -> Response:
        infos = [_info(v) for v in registry.versions()]
        return Response(msgspec.json.encode(AdapterList(infos)), media_type="application/json")

    async def publish(request: Request) -> Response:
        role = request.path_params["role"]
        if registry.current(role) is None:
            raise NotFound(f"Role `{role}` has no adapter.", param="role")
        body: PublishRequest = await read_json(request, config.max_body_bytes, decoder)
        if not body.path or "\x00" in body.path:
            raise BadRequest("path must be a non-empty folder path without NUL characters.", param="path")
        with admission.slot("route:admin", config.admission.max_concurrent_admin):
            try:
                version = await registry.publish(role, Path(body.path))
            except AdapterError as err:
                raise BadRequest(str(err), param="path") from None
            except (OSError, ValueError) as err:  # a path the OS refuses (too long, bad bytes, ...)
                raise BadRequest(f"path cannot be read: {type(err).__name__}", param="path") from None
        return Response(msgspec.json.encode(_info(version)), media_type="application/json")

    return [
        ApiRoute("/v1/adapters", list_adapters, method="GET", summary="Adapter versions served",
                 response_type=AdapterList),
        ApiRoute("/v1/adapters/{role}", publish, method="POST", summary="Publish a PEFT folder as the role's next "
                 "version", request_type=PublishRequest, response_type=AdapterInfo, is_admin=True),
    ]
