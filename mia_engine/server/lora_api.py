"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: vLLM's routes for adding and removing
a LoRA adapter by name while serving, with vLLM's bodies, answers and status codes.

vLLM serves them only under ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (its log calls them "ONLY for local
development": any client could load code paths of its choosing). Here they are always on and in the admin
scope instead, as ``POST /v1/adapters/{role}`` is: the admin key, an admin admission slot, and a folder under
one of the configured adapter folders (``adapters_api.loadable_path``), checked before anything is read.

A loaded adapter is a model id on a base model's engine (``engines/lora_models.py``): the engine of the
body's ``base_model_name`` (an extension of ours, named as in vLLM's ``--lora-modules`` JSON: a base model's
id), else the only engine, else the Planner's. Answers: 200 with vLLM's plain-text line; 400 for a name
already served (unless ``load_inplace``, which publishes the folder as the id's next version), a base
model's or a reserved id, an adapter the engine cannot serve, an unload of what the research agent uses;
404 for an unload of an unknown name and a ``lora_path`` with no adapter (as vLLM); 403 for a folder
outside the adapter folders or one holding a symbolic link or a special file (the engine loads a private
copy of the folder: ``engines/adapter_staging.py``); 503 until the engines are up.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute

from ..config import ServerConfig
from ..engines.adapter_staging import AdapterFileRefused
from ..engines.adapters import AdapterError, AdapterNotFound, AdapterVersion
from ..engines.client import EngineUnavailable
from ..engines.lora_models import LoRARefused, UnknownLoRA
from .admission import Admission
from .adapters_api import loadable_path
from .body import decode_body, read_body
from .errors import BadRequest, Forbidden, NotFound, Unavailable
from .ignored_fields import warn_ignored
from .openapi import ApiRoute

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"


class LoadLoRAAdapterRequest(msgspec.Struct):
    """vLLM's ``LoadLoRAAdapterRequest``, plus ``base_model_name``."""

    lora_name: str
    """The model id clients will name."""
    lora_path: str
    """A PEFT adapter folder on the server's disk, under a configured adapter folder."""
    load_inplace: bool = False
    """Replace the adapter of an id already served (published as its next version)."""
    base_model_name: str | None = None
    """The base model id whose engine serves the adapter (None: the only engine, else the Planner's)."""
    is_3d_lora_weight: bool = False
    """vLLM's flag for MoE (3D) LoRA weights: not supported here, so only False is taken."""


class UnloadLoRAAdapterRequest(msgspec.Struct):
    """vLLM's ``UnloadLoRAAdapterRequest``."""

    lora_name: str
    lora_int_id: int | None = None
    """Accepted as vLLM accepts it; the name decides."""


class LoRAModels(Protocol):
    """Adapters loaded and unloaded by name (``engines.lora_models.RuntimeLoRAs``)."""

    def check_load(self, name: str, base_model: str | None, *, replace: bool) -> None: ...

    async def load(self, name: str, path: Path, base_model: str | None = None, *,
                   replace: bool = False) -> AdapterVersion: ...

    async def unload(self, name: str) -> AdapterVersion: ...


def lora_routes(loras: LoRAModels, config: ServerConfig, admission: Admission,
                load_dirs: Sequence[Path] = ()) -> list[BaseRoute]:
    """The two routes; ``load_dirs``: the folders an adapter may be loaded from (none: every load is 403)."""
    load_dirs = [Path(folder).expanduser().resolve() for folder in load_dirs]
    load_decoder = msgspec.json.Decoder(LoadLoRAAdapterRequest)
    unload_decoder = msgspec.json.Decoder(UnloadLoRAAdapterRequest)

    async def load(request: Request) -> Response:
        raw = await read_body(request, config.max_body_bytes)
        body: LoadLoRAAdapterRequest = decode_body(raw, load_decoder)
        warn_ignored(LOAD_ROUTE, raw, LoadLoRAAdapterRequest)
        if not body.lora_name or not body.lora_path:
            raise BadRequest("Both 'lora_name' and 'lora_path' must be provided.",
                             param="lora_path" if body.lora_name else "lora_name")
        if body.is_3d_lora_weight:
            raise BadRequest("3D (MoE) LoRA weights are not supported.", param="is_3d_lora_weight")
        async with admission.slot("route:admin", config.admission.max_concurrent_admin):
            with _refusals():
                loras.check_load(body.lora_name, body.base_model_name, replace=body.load_inplace)
                path = loadable_path(body.lora_path, load_dirs, "lora_path")
                await loras.load(body.lora_name, path, body.base_model_name, replace=body.load_inplace)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload(request: Request) -> Response:
        raw = await read_body(request, config.max_body_bytes)
        body: UnloadLoRAAdapterRequest = decode_body(raw, unload_decoder)
        warn_ignored(UNLOAD_ROUTE, raw, UnloadLoRAAdapterRequest)
        if not body.lora_name:
            raise BadRequest("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
        async with admission.slot("route:admin", config.admission.max_concurrent_admin):
            with _refusals():
                await loras.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return [
        ApiRoute(LOAD_ROUTE, load, method="POST", summary="Serve a PEFT folder as a model id (vLLM's route)",
                 scope="admin", request_type=LoadLoRAAdapterRequest, response_type=str, media_type="text/plain"),
        ApiRoute(UNLOAD_ROUTE, unload, method="POST", summary="Stop serving a model id loaded as an adapter "
                 "(vLLM's route)", scope="admin", request_type=UnloadLoRAAdapterRequest, response_type=str,
                 media_type="text/plain"),
    ]


@contextmanager
def _refusals() -> Iterator[None]:
    """The engines' refusals as HTTP errors: ``LoRARefused`` 400, ``UnknownLoRA`` 404, a folder without an
    adapter 404, one holding a link or a special file 403 and one the engine cannot serve 400 (all naming
    ``lora_path``), 503 while the engines are not up."""
    try:
        yield
    except LoRARefused as err:
        raise BadRequest(str(err), param=err.param) from None
    except UnknownLoRA as err:
        raise NotFound(str(err), param="lora_name", code="model_not_found") from None
    except AdapterNotFound as err:
        raise NotFound(str(err), param="lora_path", code="adapter_not_found") from None
    except AdapterFileRefused as err:
        raise Forbidden(str(err), param="lora_path", code="adapter_file_not_allowed") from None
    except AdapterError as err:
        raise BadRequest(str(err), param="lora_path") from None
    except (OSError, ValueError) as err:  # a path the OS refuses (too long, bad bytes, ...)
        raise BadRequest(f"lora_path cannot be read: {type(err).__name__}", param="lora_path") from None
    except EngineUnavailable as err:
        raise Unavailable(str(err), code="engine_not_ready") from None
