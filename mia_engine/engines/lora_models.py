"""LoRA adapters added and removed by name while serving (``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, vLLM's routes): each is a model id on a base model's engine, served as a role is
(its own adapter versions; the engine's sampling defaults, or the role's where the name is a configured role
unloaded before).

The rules follow vLLM's ``OpenAIServingModels``: a name already served is refused unless ``load_inplace``,
which publishes the folder as the id's next version (a fresh LoRA id and name, as every publish: vLLM's
in-place reload keeps its prefix cache of the old weights); a base model's id is never an adapter's.
Unloading takes the id off at once (new requests get 404) and removes the LoRA from its engine once the
requests still running on it end (``adapters.AdapterRegistry.unregister``). What the research agent uses
(``agent.roles``), what serves no adapter of its own and what an alias points at cannot be unloaded; an
adapter role of the config that none of those is (a ``--lora-modules`` one) can, as vLLM's static LoRA
modules can.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import msgspec

from ..base.log_text import printable
from ..config import RESERVED_MODEL_IDS, SamplingDefaults, resolve_role
from ..config.lora_modules import check_model_id, default_lora_engine
from .adapters import AdapterVersion
from .client import EngineUnavailable
from .role_handle import RoleHandle, RoleTarget
from .roles import RoleServer
from .vllm_engine import VLLMEngine

log = logging.getLogger(__name__)


class LoRARefused(ValueError):
    """A load or unload the rules refuse (HTTP 400), naming the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class UnknownLoRA(LookupError):
    """No model id of that name is served (HTTP 404)."""


class RuntimeLoRAs:
    """Loads and unloads of adapters by name on a ``RoleServer``, one at a time."""

    def __init__(self, server: RoleServer) -> None:
        self._server = server
        self._lock = asyncio.Lock()

    def check_load(self, name: str, base_model: str | None, *, replace: bool) -> None:
        """Refuse (``LoRARefused``) a load whose name or base model the rules refuse, before its folder is
        read; ``load`` checks again. ``EngineUnavailable`` until the engines are up."""
        if not self._server.is_ready():
            raise EngineUnavailable(self._server.not_ready_reason())
        handle = self._server.find(name)
        if handle is None:
            problem = check_model_id(name) or ("is a reserved model id" if name in RESERVED_MODEL_IDS else None)
            if problem is not None:
                raise LoRARefused(f"The lora adapter name '{name}' {problem}.", "lora_name")
            self._engine(base_model)
            return
        if handle.target.owned_by == "engine":
            raise LoRARefused(f"The lora adapter '{name}' conflicts with a served base model.", "lora_name")
        if not replace:
            raise LoRARefused(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                              "in place, set 'load_inplace' to True.", "lora_name")
        if handle.target.adapter_role != name:
            raise LoRARefused(f"'{name}' serves no LoRA adapter of its own, so there is none to replace in place.",
                              "lora_name")
        if base_model and self._engine(base_model) is not handle.engine:
            raise LoRARefused(f"'{name}' runs on engine {handle.engine.name}; base_model_name names another.",
                              "base_model_name")

    async def load(self, name: str, path: Path, base_model: str | None = None, *,
                   replace: bool = False) -> AdapterVersion:
        """Serve the PEFT folder ``path`` as model id ``name`` on the engine of ``base_model`` (a base model's
        id; None: ``default_lora_engine``), or (``replace``) as the next version of an id already served; the
        engine loads a private copy of the folder (``AdapterRegistry.publish(stage=True)``). Raises
        ``LoRARefused``, ``adapters.AdapterError`` (its subclass ``AdapterNotFound`` where no adapter is at
        ``path``), ``adapter_staging.AdapterFileRefused`` or ``EngineUnavailable``."""
        server = self._server
        async with self._lock:
            self.check_load(name, base_model, replace=replace)
            handle = server.find(name)
            if handle is not None:
                version = await server.adapters.publish(name, path, stage=True)
                log.info("LoRA adapter %s reloaded from %s as %s@v%d on engine %s", name,
                         printable(str(version.origin)), name, version.version, handle.engine.name)
                return version
            engine = self._engine(base_model)
            version = await server.adapters.register(name, engine, path, stage=True)
            sampling, template_kwargs = self._defaults(name)
            server.serve(name, RoleTarget(engine, name, sampling, "role", template_kwargs))
            log.info("LoRA adapter %s loaded from %s as %s@v%d on engine %s", name,
                     printable(str(version.origin)), name, version.version, engine.name)
            return version

    async def unload(self, name: str) -> AdapterVersion:
        """Stop serving model id ``name``; its engine drops the adapter once its running requests end.
        Raises ``UnknownLoRA``, ``LoRARefused`` or ``EngineUnavailable``."""
        server = self._server
        async with self._lock:
            if not server.is_ready():
                raise EngineUnavailable(server.not_ready_reason())
            handle = server.find(name)
            if handle is None:
                raise UnknownLoRA(f"The lora adapter '{name}' cannot be found.")
            problem = self._unload_refusal(name, handle)
            if problem is not None:
                raise LoRARefused(f"The lora adapter '{name}' cannot be unloaded: {problem}.", "lora_name")
            server.drop(name)
            version = await server.adapters.unregister(name)
            log.info("LoRA adapter %s unloaded (%s@v%d; engine %s removes it once its %d running requests end)",
                     name, name, version.version, handle.engine.name, version.in_flight)
            return version

    def _engine(self, base_model: str | None) -> VLLMEngine:
        """The engine of ``base_model`` (a base model's id), else the default one, with LoRA enabled."""
        server = self._server
        if base_model:
            handle = server.find(base_model)
            if handle is None or handle.target.owned_by != "engine":
                bases = sorted(n for n, h in server.handles().items() if h.target.owned_by == "engine")
                raise LoRARefused(f"base_model_name '{base_model}' is not a base model served here (base models: "
                                  f"{', '.join(bases)}).", "base_model_name")
            engine = handle.engine
        else:
            engine = server.engines.get(default_lora_engine(server.config))
            if engine is None:
                raise LoRARefused("This server has several engines and none is the Planner's: name the engine's "
                                  "base model in base_model_name.", "base_model_name")
        if not engine.config.enable_lora:
            raise LoRARefused(f"Engine {engine.name} serves no LoRA adapters (enable_lora = false).",
                              "base_model_name")
        return engine

    def _defaults(self, name: str) -> tuple[SamplingDefaults, dict]:
        """Sampling defaults and chat-template variables of a loaded id: a configured role's own, where the name
        is one (unloaded before), else none."""
        role = self._server.config.roles.get(name)
        if role is None or role.alias_of:
            return SamplingDefaults(), {}
        return role.sampling, dict(role.chat_template_kwargs)

    def _unload_refusal(self, name: str, handle: RoleHandle) -> str | None:
        """Why model id ``name`` must stay (None: it may go)."""
        server, target = self._server, handle.target
        if target.owned_by == "engine":
            return "it is a base model"
        config = server.config
        for field, model in msgspec.structs.asdict(config.agent.roles).items():
            if name == model or model in config.roles and resolve_role(config, model)[0] == name:
                return f"the research agent uses it (agent.roles.{field})"
        if target.adapter_role != name:
            return "it serves no LoRA adapter of its own"
        aliases = sorted(other for other, h in server.handles().items()
                         if other != name and h.target.adapter_role == name)
        if aliases:
            return f"{', '.join(aliases)} {'is an alias' if len(aliases) == 1 else 'are aliases'} of it"
        return None
