"""``/v1/adapters``: the adapter versions each role serves, and publishing a new one from disk.

Publishing loads a PEFT folder that is already on the server's disk (the learner writes them; an
operator can too) as the role's next version: new requests use it at once, running ones finish on
theirs. The listing asks the engines which data-parallel replicas hold each version (a published
version must be on every replica of its role's engine). Listing needs the API key and shows each
version's folder to the admin scope only (others see its name, ``role@vN``: absolute server paths are
the operator's business); publishing needs
the admin key, an admin admission slot, and a folder under one of the configured adapter folders
(``load_dirs``: ``<data_dir>/adapters``, ``learner.publish_dir``, ``server.adapter_dirs``), checked with
symlinks resolved before anything in it is read. The engine loads a private copy of it
(``engines/adapter_staging.py``): a folder holding a symbolic link or a special file is refused (403
``adapter_file_not_allowed``, naming the file), and a swap of its files after the check changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..config import ServerConfig
from ..engines.adapter_staging import AdapterFileRefused
from ..engines.adapters import AdapterError, AdapterRegistry, AdapterVersion
from .admission import Admission
from .body import read_json
from .errors import BadRequest, Forbidden, NotFound
from .openapi import ApiRoute
from .security import is_admin

log = logging.getLogger(__name__)


class PublishRequest(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    """A PEFT adapter folder on the server's disk."""


class AdapterInfo(msgspec.Struct):
    role: str
    version: int
    lora_id: int
    name: str
    """The version's name, ``role@vN`` (the LoRA name the engines know it by)."""
    path: str | None
    """Its folder on the server's disk, for admin-scope callers only; None for an API key holder."""
    in_flight: int
    is_live: bool
    """False for a replaced version that still finishes its in-flight requests."""
    loaded_replicas: list[int] | None = None
    """The data-parallel replicas (ranks) of the role's engine that hold this version; None when the
    engine did not answer (it is stopping or dead)."""
    num_replicas: int | None = None
    """The data-parallel replicas of the role's engine; None when the engine did not answer."""


def _info(v: AdapterVersion, loaded: list[set[int]] | None = None, *, show_path: bool = True) -> AdapterInfo:
    """``show_path``: include the folder (admin scope only)."""
    replicas = None if loaded is None else [rank for rank, ids in enumerate(loaded) if v.lora_id in ids]
    return AdapterInfo(v.role, v.version, v.lora_id, v.lora_request().lora_name, str(v.origin) if show_path else None,
                       v.in_flight, not v.is_retired, replicas, None if loaded is None else len(loaded))


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


def loadable_path(path: str, load_dirs: Sequence[Path], param: str = "path") -> Path:
    """``path`` with its symlinks resolved, refused (403) unless it lies under one of ``load_dirs``; the
    resolved path is what gets loaded, so a link swapped after the check changes nothing. ``param``: the
    request field that holds it."""
    if not path or "\x00" in path:
        raise BadRequest(f"{param} must be a non-empty folder path without NUL characters.", param=param)
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop, a name the OS refuses
        raise BadRequest(f"{param} cannot be resolved: {type(err).__name__}", param=param) from None
    if not any(resolved.is_relative_to(folder) for folder in load_dirs):
        raise Forbidden(f"{param} must lie under a configured adapter folder (the data dir's adapters folder, "
                        "learner.publish_dir or server.adapter_dirs).", param=param, code="adapter_path_not_allowed")
    return resolved


class AdapterList(msgspec.Struct):
    data: list[AdapterInfo]
    object: str = "list"


def adapter_routes(registry: AdapterRegistry, config: ServerConfig | None = None,
                   admission: Admission | None = None, load_dirs: Sequence[Path] = ()) -> list[BaseRoute]:
    """The listing and the publish route; ``load_dirs``: the folders a published adapter may come from
    (none: every publish is refused)."""
    config = config or ServerConfig()
    load_dirs = [Path(folder).expanduser().resolve() for folder in load_dirs]
    admission = admission or Admission(config.admission)
    decoder = msgspec.json.Decoder(PublishRequest)

    async def list_adapters(request: Request) -> Response:
        versions = registry.versions()
        loaded = await _loaded_by_role(registry, {v.role for v in versions})
        show_path = is_admin(request)
        infos = [_info(v, loaded[v.role], show_path=show_path) for v in versions]
        return Response(msgspec.json.encode(AdapterList(infos)), media_type="application/json")

    async def publish(request: Request) -> Response:
        role = request.path_params["role"]
        if registry.current(role) is None:
            raise NotFound(f"Role `{role}` has no adapter.", param="role")
        body: PublishRequest = await read_json(request, config.max_body_bytes, decoder)
        path = loadable_path(body.path, load_dirs)
        async with admission.slot("route:admin", config.admission.max_concurrent_admin):
            try:
                version = await registry.publish(role, path, stage=True)
            except AdapterFileRefused as err:
                raise Forbidden(str(err), param="path", code="adapter_file_not_allowed") from None
            except AdapterError as err:
                raise BadRequest(str(err), param="path") from None
            except (OSError, ValueError) as err:  # a path the OS refuses (too long, bad bytes, ...)
                raise BadRequest(f"path cannot be read: {type(err).__name__}", param="path") from None
        loaded = await _loaded_by_role(registry, {role})
        return Response(msgspec.json.encode(_info(version, loaded[role])), media_type="application/json")

    return [
        ApiRoute("/v1/adapters", list_adapters, method="GET", summary="Adapter versions served",
                 scope=("chat", "agent"), response_type=AdapterList),
        ApiRoute("/v1/adapters/{role}", publish, method="POST", summary="Publish a PEFT folder as the role's next "
                 "version", scope="admin", request_type=PublishRequest, response_type=AdapterInfo),
    ]
