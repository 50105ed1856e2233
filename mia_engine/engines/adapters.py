"""Versioned LoRA adapters per role, swapped under live traffic.

vLLM caches an adapter by id and keys its prefix cache by (name, path), so re-using an id or a path
for new weights silently serves stale ones (shared/ENGINE-NOTES.md). Every published version therefore
gets a fresh id, name and path. New requests switch to it at once; the old version stays loaded until
its last in-flight request ends, and only then is it removed from the engine. A role removed while serving
(``POST /v1/unload_lora_adapter``) drains the same way; added again later under the same name, its versions
continue their numbering.

A folder a request names is published ``stage=True``: the registry checks and loads a private copy of it
(``adapter_staging.py``), removed once the version leaves the engine, so that no one who can write the
folder can change the weights between the check and the engine's reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vllm.lora.request import LoRARequest

from ..base.log_text import printable
from .adapter_staging import AdapterStaging

log = logging.getLogger(__name__)


class AdapterError(ValueError):
    """An adapter that cannot be served; the previous version (if any) keeps serving."""


class AdapterNotFound(AdapterError):
    """No PEFT adapter at the path (vLLM answers its ``load_lora_adapter`` with 404 for this)."""


class LoRAHost(Protocol):
    """What the registry needs of an engine."""

    max_lora_rank: int

    async def add_lora(self, request: LoRARequest) -> bool: ...

    async def remove_lora(self, lora_id: int) -> bool: ...

    async def loaded_loras(self) -> list[set[int]]:
        """The LoRA ids each data-parallel replica holds, in rank order."""
        ...


@dataclass
class AdapterVersion:
    role: str
    version: int
    lora_id: int
    path: Path
    """The folder the engine loads (and the learner reads): a private copy where ``source`` is set."""
    in_flight: int = 0
    is_retired: bool = False
    source: Path | None = None
    """The folder a request named, of which ``path`` is the checked copy (None: ``path`` loads in place)."""

    @property
    def origin(self) -> Path:
        """The folder it was published from, as listings and logs show it."""
        return self.source or self.path

    def lora_request(self) -> LoRARequest:
        return LoRARequest(f"{self.role}@v{self.version}", self.lora_id, str(self.path))


def check_adapter_dir(path: Path, max_rank: int, shown_as: Path | None = None) -> None:
    """Reject what vLLM would reject deep inside its worker, with a message that says why (reads every
    tensor: blocking, run it off the event loop). ``shown_as``: the folder the messages name (the one a
    staged copy was made from)."""
    _check_weights(path, read_adapter_config(path, max_rank, shown_as)["r"], shown_as or path)


def read_adapter_config(path: Path, max_rank: int, shown_as: Path | None = None) -> dict:
    """The adapter's ``adapter_config.json``, refused unless it is a plain LoRA of rank 1..``max_rank``
    with both PEFT files present (no tensor is read)."""
    shown = shown_as or path
    config_file = path / "adapter_config.json"
    if not config_file.is_file() or not (path / "adapter_model.safetensors").is_file():
        raise AdapterNotFound(f"{shown}: not a PEFT adapter (needs adapter_config.json + adapter_model.safetensors)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise AdapterError(f"{shown / config_file.name}: unreadable: {err}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise AdapterError(f"{shown}: only plain LoRA adapters are supported")
    rank = config.get("r")
    if not isinstance(rank, int) or not 0 < rank <= max_rank:
        raise AdapterError(f"{shown}: rank {rank!r} is not in 1..{max_rank} (engine max_lora_rank)")
    return config


def _check_weights(path: Path, rank: int, shown: Path) -> None:
    """Every tensor finite and of the declared rank: one NaN would poison every request on the role."""
    import torch

    try:
        for key, tensor in _safetensors_tensors(path / "adapter_model.safetensors"):
            if "lora_A" in key and tensor.shape[0] != rank or "lora_B" in key and tensor.shape[-1] != rank:
                raise AdapterError(f"{shown}: {key} has shape {tuple(tensor.shape)}, not rank {rank}")
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise AdapterError(f"{shown}: {key} holds non-finite values")
    except AdapterError:
        raise
    except Exception as err:  # a truncated or foreign file
        raise AdapterError(f"{shown}: unreadable adapter weights: {err}") from None


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
"""The safetensors format's dtype names (those an adapter may hold) as torch's."""


def _safetensors_tensors(file: Path) -> Iterator[tuple[str, Any]]:
    """Each tensor of a safetensors file (an 8-byte little-endian header length, a JSON header of name ->
    dtype, shape, data offsets, then the data), read one at a time. Not safetensors' own reader: in
    safetensors 0.8 every ``get_tensor`` leaves two Python objects behind, which the publishes of a
    long-running server add up, and its whole-file ``load`` holds the GIL for the whole file (the event loop
    stalls); a file this reader refuses, vLLM's would too (offsets and sizes are checked)."""
    import torch

    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8:
            raise ValueError(f"header of {header_len} bytes in a file of {size}")
        header = json.loads(f.read(header_len))
        base = 8 + header_len
        for key, info in header.items():
            if key == "__metadata__":
                continue
            dtype = getattr(torch, _SAFETENSORS_DTYPES[info["dtype"]])
            begin, end = info["data_offsets"]
            shape = [int(d) for d in info["shape"]]
            if not 0 <= begin <= end <= size - base or math.prod(shape) * dtype.itemsize != end - begin:
                raise ValueError(f"{key}: data offsets {begin}..{end} do not hold shape {shape} of {info['dtype']}")
            f.seek(base + begin)
            data = bytearray(f.read(end - begin))
            yield key, (torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)).reshape(shape)


class AdapterRegistry:
    """The current adapter version of every role with an adapter, and the versions being drained. A role
    (model id) may also be added while serving (``register``) and removed (``unregister``)."""

    def __init__(self) -> None:
        self._hosts: dict[str, LoRAHost] = {}
        self._current: dict[str, AdapterVersion] = {}
        self._draining: dict[int, AdapterVersion] = {}
        self._version_hosts: dict[int, LoRAHost] = {}
        """LoRA id -> the engine that holds it, until it is removed (a removed role's versions drain there)."""
        self._last_version: dict[str, int] = {}
        """Each role's last version number, kept when the role is removed: a role added again under the same
        name continues the numbering, so its LoRA name (and vLLM's prefix-cache key) is never reused."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._next_lora_id = 1
        self._removals: set[asyncio.Task[None]] = set()
        self._listeners: list[Callable[[AdapterVersion], Awaitable[None] | None]] = []
        self.staging: AdapterStaging | None = None
        """Where ``publish(stage=True)`` copies a folder before it is checked and loaded; set once by the
        composition root (``services.py``). None: such folders load in place (a registry without a data dir)."""

    def roles(self) -> list[str]:
        return list(self._current)

    def current(self, role: str) -> AdapterVersion | None:
        return self._current.get(role)

    def versions(self) -> list[AdapterVersion]:
        """Live versions, then retired ones still finishing their requests."""
        return list(self._current.values()) + list(self._draining.values())

    def serves(self, role: str, host: LoRAHost) -> bool:
        """Whether the role has a current version, on ``host``'s engine."""
        return role in self._current and self._hosts.get(role) is host

    async def loaded_loras(self, role: str) -> list[set[int]]:
        """The LoRA ids each data-parallel replica of the role's engine holds, in rank order: a published
        version is in every set, a drained one in none."""
        host = self._hosts.get(role) or next(
            self._version_hosts[v.lora_id] for v in self._draining.values() if v.role == role)
        return await host.loaded_loras()

    def on_publish(self, listener: Callable[[AdapterVersion], Awaitable[None] | None]) -> None:
        self._listeners.append(listener)

    async def register(self, role: str, host: LoRAHost, path: Path, *, stage: bool = False) -> AdapterVersion:
        """Load a role's first adapter version on ``host``; where that fails, the role stays unknown.
        ``stage``: as for ``publish``."""
        if role in self._current:
            raise AdapterError(f"role {role!r} already has an adapter")
        self._hosts[role] = host
        self._locks.setdefault(role, asyncio.Lock())
        try:
            return await self.publish(role, path, stage=stage)
        except BaseException:
            if role not in self._current:
                self._hosts.pop(role, None)
            raise

    async def unregister(self, role: str) -> AdapterVersion:
        """Stop serving the role's adapter: new requests find no version at once; the current one is removed
        from its engine once its in-flight requests end (as a replaced version is). Raises ``KeyError`` for
        a role without an adapter."""
        async with self._locks[role]:
            version = self._current.pop(role)
            del self._hosts[role]
            version.is_retired = True
            self._draining[version.lora_id] = version
            self._remove_if_drained(version)
        return version

    async def publish(self, role: str, path: Path, *, stage: bool = False) -> AdapterVersion:
        """Load ``path`` as the role's next version and switch new requests to it atomically. ``stage``: a
        folder a request named, checked and loaded as a private copy (``staging``); ``AdapterFileRefused``
        where it holds a link or a special file."""
        host = self._hosts.get(role)
        if host is None:
            raise AdapterError(f"role {role!r} has no adapter")
        path = path.resolve()
        # Every tensor is read and checked: hundreds of MB for an 8B model's adapter, so off the loop.
        loaded = await asyncio.to_thread(self._checked, path, host.max_lora_rank, stage)
        try:
            new = await self._switch(role, host, path, loaded)
        except BaseException:
            if loaded != path and self.staging is not None:
                self.staging.discard(loaded)
            raise
        for listener in self._listeners:
            result = listener(new)
            if result is not None:
                await result
        return new

    def _checked(self, path: Path, max_rank: int, stage: bool) -> Path:
        """The folder to load: ``path`` checked, or (``stage``) its private copy, checked. Blocking."""
        if not stage or self.staging is None:
            check_adapter_dir(path, max_rank)
            return path
        try:
            staged = self.staging.stage(path)
        except (FileNotFoundError, NotADirectoryError):
            raise AdapterNotFound(f"{path}: not a PEFT adapter (no such folder)") from None
        try:
            check_adapter_dir(staged, max_rank, shown_as=path)
        except BaseException:
            self.staging.discard(staged)
            raise
        return staged

    async def _switch(self, role: str, host: LoRAHost, path: Path, loaded: Path) -> AdapterVersion:
        """Load the checked folder ``loaded`` (``path`` or its copy) on ``host`` as the role's next version."""
        async with self._locks[role]:
            if self._hosts.get(role) is not host:
                raise AdapterError(f"role {role!r} was removed while its adapter was being checked")
            old = self._current.get(role)
            if old is not None and old.origin == path:
                raise AdapterError(f"{path} is already served as {role}@v{old.version}; publish a new folder")
            new = AdapterVersion(role, self._last_version.get(role, 0) + 1, self._next_lora_id, loaded,
                                 source=path if loaded != path else None)
            self._next_lora_id += 1
            try:
                await host.add_lora(new.lora_request())
            except Exception as err:  # vLLM raises assorted errors for unloadable weights
                raise AdapterError(f"{path}: the engine could not load the adapter: {err}") from None
            self._current[role] = new
            self._last_version[role] = new.version
            self._version_hosts[new.lora_id] = host
            log.info("adapter %s@v%d is live (lora id %d, %s%s)", role, new.version, new.lora_id,
                     printable(str(path)), f", loaded from its copy {loaded}" if new.source else "")
            if old is not None:
                old.is_retired = True
                self._draining[old.lora_id] = old
                self._remove_if_drained(old)
        return new

    @asynccontextmanager
    async def acquire(self, role: str) -> AsyncIterator[LoRARequest]:
        """The role's current version for one request; it stays loaded until the request ends."""
        version = self._current[role]
        version.in_flight += 1
        try:
            yield version.lora_request()
        finally:
            version.in_flight -= 1
            self._remove_if_drained(version)

    def _remove_if_drained(self, version: AdapterVersion) -> None:
        if not (version.is_retired and version.in_flight == 0):
            return
        task = asyncio.get_running_loop().create_task(self._remove(version))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _remove(self, version: AdapterVersion) -> None:
        self._draining.pop(version.lora_id, None)
        host = self._version_hosts.pop(version.lora_id, None)
        if host is None:
            return  # removed already
        try:
            await host.remove_lora(version.lora_id)
            log.info("adapter %s@v%d drained and unloaded", version.role, version.version)
        except Exception as err:  # an engine that is shutting down; nothing left to free
            log.warning("could not unload adapter %s@v%d: %s", version.role, version.version, err)
        if version.source is not None and self.staging is not None:
            await asyncio.to_thread(self.staging.discard, version.path)
