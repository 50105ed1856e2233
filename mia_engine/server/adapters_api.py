"""``/v1/adapters``: the adapter versions each role serves, and publishing a new one from disk.

Publishing loads a PEFT folder that is already on the server's disk (the learner writes them; an
operator can too) as the role's next version: new requests use it at once, running ones finish on
theirs. Behind ``--api-key`` like every /v1 route.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..engines.adapters import AdapterError, AdapterRegistry, AdapterVersion
from .errors import BadRequest, NotFound, decode_body


class PublishRequest(msgspec.Struct):
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


def adapter_routes(registry: AdapterRegistry) -> list[BaseRoute]:
    decoder = msgspec.json.Decoder(PublishRequest)

    async def list_adapters(request: Request) -> Response:
        infos = [_info(v) for v in registry.versions()]
        return Response(msgspec.json.encode({"object": "list", "data": infos}), media_type="application/json")

    async def publish(request: Request) -> Response:
        role = request.path_params["role"]
        if registry.current(role) is None:
            raise NotFound(f"Role `{role}` has no adapter.", param="role")
        body = decode_body(await request.body(), decoder)
        try:
            version = await registry.publish(role, Path(body.path))
        except AdapterError as err:
            raise BadRequest(str(err), param="path") from None
        return Response(msgspec.json.encode(_info(version)), media_type="application/json")

    return [
        Route("/v1/adapters", list_adapters, methods=["GET"]),
        Route("/v1/adapters/{role}", publish, methods=["POST"]),
    ]
