"""Roles on engines: the ``EngineClient`` the HTTP layer and the agent talk to.

Each role (planner, executor, manager, and aliases such as judge -> manager) is a model id that maps
to an engine, an optional versioned LoRA adapter and sampling defaults; each engine's name is also a
model id, for its bare base model. Roles on the same base model share one engine. ``RoleServer`` starts
the engines (in groups that may start together, then each one's warm-up) and hands out one
``RoleHandle`` per model id (``role_handle.py``: tokenizing and generation); ``outputs.py`` turns vLLM's
outputs into ours; ``lora_models.py`` adds and removes adapters by name while it serves.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import MappingProxyType

from ..base.parent_watch import mark_root
from ..config import MIAConfig, SamplingDefaults, resolve_role
from ..config.roles import INIT_ADAPTER
from ..models.cache import default_home
from ..models.embedded import adapter_dir, is_embedded, model_dir
from ..models.lora import initial_adapter
from .adapters import AdapterRegistry
from .client import ModelCard
from .platforms import Platform, resolve_platform
from .role_handle import RoleHandle, RoleTarget, UsageObserver
from .startup import applied_env, engine_env, process_state_kept, start_groups, use_spawn
from .output_parsers import EngineParsers
from .tool_parsers import check_parser_names
from .vllm_engine import VLLMEngine
from .warmup import warm_up

log = logging.getLogger(__name__)


class RoleServer:
    """Starts the engines of a config and serves its roles; implements ``EngineClient``."""

    def __init__(self, config: MIAConfig, platform: Platform | None = None) -> None:
        """Build it in the main thread, before any engine starts: it makes vLLM spawn its processes.
        ``platform``: the one the server resolved (None: resolve it here). The engine processes die with
        the process that builds it (``base/parent_watch.py``), whether it serves, evaluates or benchmarks."""
        use_spawn()
        mark_root()
        self.config = config
        self.platform = platform or resolve_platform(config.cpu)
        self.home = Path(config.models.home).expanduser() if config.models.home else default_home()
        self.adapters = AdapterRegistry()
        self.engines: dict[str, VLLMEngine] = {}
        self._handles: dict[str, RoleHandle] = {}
        """Model id -> its handle, once its engine is up."""
        self._parsers: dict[str, EngineParsers] = {}
        """Engine name -> its output parsers (``reasoning_parser``, ``tool_call_parser``; either may be unset)."""
        self._is_started = False
        self._error: str | None = None
        self.initial_adapters: dict[str, Path] = {}
        """Adapter folders that replace a role's configured one at start (the latest learned checkpoint)."""
        self._warming_up: str | None = None
        """The engine warming up now (``warmup.py``), for the 503 while the server starts."""
        self.usage: UsageObserver | None = None
        """Told about every finished request (the server's per-role token and prefix-cache metrics)."""

    async def start(self) -> None:
        """Build/resolve models, spawn the engines (concurrently where ``start_groups`` allows), load
        adapters; failures are kept, not raised."""
        try:
            await self._start()
            self._is_started = True
            log.info("ready: serving %s", ", ".join(self._handles))
        except Exception as err:
            self._error = f"engine start failed: {type(err).__name__}: {err}"
            log.exception("engine start failed")

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        config_lock = threading.Lock()
        check_parser_names(self.config)  # before any engine starts
        envs = {name: {**engine_env(engine), **self.platform.spawn_env(engine)}
                for name, engine in self.config.engines.items()}
        for group in start_groups(self.config.engines, envs):
            engines = []
            for name in group:
                engine_config = self.config.engines[name]
                path = await loop.run_in_executor(None, model_dir, engine_config.model, self.home)
                engines.append(VLLMEngine(name, engine_config, path, self.platform))
                log.info("starting engine %s from %s", name, path)
            results = await start_together(engines, config_lock, envs[group[0]])
            for engine in engines:  # registered even when a sibling failed, so shutdown() stops them
                self.engines[engine.name] = engine
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            for engine in engines:
                self._parsers_of(engine)  # a parser the model's tokenizer cannot serve stops the start here
                for model_id in engine.config.model_ids(engine.name):
                    self.serve(model_id, RoleTarget(engine, None, SamplingDefaults(), "engine", {}))
        for name in self.config.roles:
            canonical, role = resolve_role(self.config, name)
            engine = self.engines[role.engine]
            if role.adapter and canonical == name:
                path = self.initial_adapters.get(name) or await loop.run_in_executor(
                    None, self._adapter_dir, name, role.adapter, engine)
                await self.adapters.register(name, engine, path)
            self.serve(name, RoleTarget(engine, canonical if role.adapter else None, role.sampling, "role",
                                        dict(role.chat_template_kwargs)))
        for engine in self.engines.values():
            if engine.config.warmup_max_seqs:
                await self._warm_up(engine)

    def _adapter_dir(self, role: str, spec: str, engine: VLLMEngine) -> Path:
        """The folder of a role's configured adapter (``init``: created in the data dir at the first start)."""
        if spec == INIT_ADAPTER:
            return initial_adapter(engine.model_dir, self.config.resolved_data_dir() / "adapters" / "init", role,
                                   engine.config.max_lora_rank)
        return adapter_dir(spec, engine.config.model, self.home)

    def serve(self, name: str, target: RoleTarget) -> None:
        """Serve model id ``name`` as ``target`` (with its engine's output parsers)."""
        self._handles[name] = RoleHandle(name, target, self.adapters, self._parsers_of(target.engine), self.usage)

    def _parsers_of(self, engine: VLLMEngine) -> EngineParsers:
        """``engine``'s output parsers, built once its tokenizer is loaded."""
        if engine.name not in self._parsers:
            self._parsers[engine.name] = EngineParsers(engine.name, engine.config.tool_call_parser,
                                                       engine.config.reasoning_parser, engine.tokenizer)
        return self._parsers[engine.name]

    def drop(self, name: str) -> None:
        """Stop serving model id ``name`` (an adapter unloaded while serving): new requests get 404."""
        del self._handles[name]

    def handles(self) -> Mapping[str, RoleHandle]:
        """Every served model id's handle (read-only)."""
        return MappingProxyType(self._handles)

    async def _warm_up(self, engine: VLLMEngine) -> None:
        """``engines/warmup.py`` on ``engine``, with the base model and every adapter of its roles."""
        targets = [handle.target for handle in self._handles.values()]
        roles = sorted({t.adapter_role for t in targets if t.engine is engine and t.adapter_role})
        self._warming_up = engine.name
        try:
            async with AsyncExitStack() as leases:
                loras = [None, *[await leases.enter_async_context(self.adapters.acquire(role)) for role in roles]]
                await warm_up(engine, loras, engine.config.warmup_max_seqs)
        finally:
            self._warming_up = None

    def shutdown(self) -> None:
        for engine in self.engines.values():
            engine.shutdown()

    def failure(self) -> str | None:
        """Why the engines cannot serve, in one line: their start failed, or a started engine died (its
        vLLM engine core stopped). None: up, or still starting."""
        if self._error:
            return self._error
        dead = [name for name, engine in self.engines.items() if self._is_started and not engine.is_running]
        if dead:
            return (f"engine {', '.join(dead)} died: its vLLM engine core stopped unexpectedly (vLLM's log above "
                    "says how)")
        return None

    # --- EngineClient ---------------------------------------------------------------------------

    def models(self) -> list[ModelCard]:
        """Every served id with vLLM's card fields: its base model's ``root`` (``base_model_root``), a role's
        ``parent`` (its engine's first base-model id) and adapter folder, its engine's context length."""
        cards = []
        for model_id, handle in self._handles.items():
            target, engine = handle.target, handle.engine
            version = self.adapters.current(target.adapter_role) if target.adapter_role else None
            parent = None if target.owned_by == "engine" else engine.config.model_ids(engine.name)[0]
            cards.append(ModelCard(model_id, target.owned_by, base_model_root(engine),
                                   version.version if version else None, parent, handle.max_model_len(),
                                   str(version.origin) if version else None))
        return cards

    def has_model(self, model: str) -> bool:
        """Served; until the engines are up, configured (an id loaded or unloaded later counts once it is)."""
        if self._is_started:
            return model in self._handles
        return model in self.config.roles or any(model in engine.model_ids(name)
                                                 for name, engine in self.config.engines.items())

    def role(self, model: str) -> RoleHandle:
        """The handle of a served model id; ``KeyError`` for one that is not (or not yet) served."""
        return self._handles[model]

    def find(self, model: str) -> RoleHandle | None:
        return self._handles.get(model)

    def is_ready(self) -> bool:
        return self._is_started and all(e.is_running for e in self.engines.values())

    def not_ready_reason(self) -> str:
        if self._error:
            return self._error
        dead = [name for name, e in self.engines.items() if not e.is_running]
        if self._is_started and dead:
            return f"engine {', '.join(dead)} is not running"
        if self._warming_up is not None:
            return f"{self.progress()}; retry shortly"
        return "the engines are starting; retry shortly"

    def progress(self) -> str:
        """What ``/health`` may show anyone while the engines start: the engine warming up, if one is."""
        return f"engine {self._warming_up} is warming up" if self._warming_up is not None else ""


def base_model_root(engine: VLLMEngine) -> str:
    """A base model's ``root`` on ``/v1/models``, as vLLM shows its ``--model``: a Hugging Face id as given,
    else the folder the engine loaded (an embedded model's built one), which a tokenizer loader can open
    (``vllm bench serve`` takes the first listed model's ``root`` as its tokenizer)."""
    spec = engine.config.model
    is_hub_id = not is_embedded(spec) and Path(spec).expanduser() != engine.model_dir
    return spec if is_hub_id else str(engine.model_dir)


async def start_together(engines: Sequence[VLLMEngine], config_lock: threading.Lock,
                         env: Mapping[str, str]) -> list[BaseException | None]:
    """Start a group of engines concurrently (``startup.start_groups`` made it); one result per engine,
    an exception where it failed. The group's spawn environment ``env`` (the platform's ``spawn_env``, the same
    for every member) is set around the starts, and what vLLM changes in this process meanwhile is
    undone once they are up (``startup.process_state_kept``)."""
    with applied_env(env), process_state_kept(env):
        results = await asyncio.gather(*(e.start(config_lock) for e in engines), return_exceptions=True)
    return [result if isinstance(result, BaseException) else None for result in results]
