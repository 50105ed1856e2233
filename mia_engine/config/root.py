"""The root of the configuration: ``MIAConfig`` gathers one struct per section (``server.py``,
``engines.py``, ``roles.py``, ``agent.py``, ``tools.py``, ``memory.py``, ``learner.py``, ``gpus.py``), each
of which checks its own fields. What is left here are the rules that span sections: a role's engine
exists, the agent's roles are served, the learner samples at the Planner's temperature."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ..base.structs import Frozen
from .agent import AgentConfig
from .cpu import CpuConfig
from .engines import EngineConfig, ModelsConfig
from .errors import ConfigError
from .gpus import GpusConfig
from .learner import LearnerConfig
from .memory import MemoryConfig
from .roles import RoleConfig
from .server import ServerConfig
from .tools import ToolsConfig

AGENT_MODEL = "mia"
"""The model id of the research agent on ``/v1/chat/completions`` (not a role: the whole loop)."""
EMBEDDING_MODEL = "embedding"
"""The model id of the memory's sentence encoder on ``/v1/embeddings`` (not a role either)."""
RESERVED_MODEL_IDS = frozenset({AGENT_MODEL, EMBEDDING_MODEL})
"""Model ids that are not roles or engines: ``mia`` is the research agent, ``embedding`` the encoder."""


class MIAConfig(Frozen):
    """The root configuration."""

    engines: dict[str, EngineConfig]
    """Engines by name."""
    roles: dict[str, RoleConfig]
    """Roles by name; each name is also a model id of the OpenAI endpoint."""
    server: ServerConfig = ServerConfig()
    models: ModelsConfig = ModelsConfig()
    memory: MemoryConfig = MemoryConfig()
    agent: AgentConfig = AgentConfig()
    tools: ToolsConfig = ToolsConfig()
    learner: LearnerConfig = LearnerConfig()
    gpus: GpusConfig = GpusConfig()
    cpu: CpuConfig = CpuConfig()
    """This process and its engines on vLLM's CPU platform (no effect on a GPU)."""
    """The hardware ``serve --dry-run`` plans for."""
    data_dir: str = ""
    """Durable state (memory store, adapter versions); empty = ``$XDG_DATA_HOME/mia_engine``."""

    def resolved_data_dir(self) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        return Path(base) / "mia_engine"


def check_sections(config: MIAConfig) -> None:
    """Cross-field rules that a struct's own types cannot express."""
    if not config.engines:
        raise ConfigError("engines: at least one engine is required")
    if not config.roles:
        raise ConfigError("roles: at least one role is required")
    for name in list(config.engines) + list(config.roles):
        if name in RESERVED_MODEL_IDS:
            raise ConfigError(f"{name}: is a reserved model id")
    clash = set(config.engines) & set(config.roles)
    if clash:
        raise ConfigError(f"roles.{sorted(clash)[0]}: a role cannot have the name of an engine")
    _check_model_ids(config)
    for name, role in config.roles.items():
        _check_role(config, name, role)
    for field, model in msgspec.structs.asdict(config.agent.roles).items():
        if model not in config.roles and model not in config.engines:
            raise ConfigError(f"agent.roles.{field}: {model!r} is neither a role nor an engine of this config")
    if config.learner.temperature != config.agent.planner_rollout_temperature:
        raise ConfigError(f"learner.temperature: {config.learner.temperature} must equal "
                          f"agent.planner_rollout_temperature ({config.agent.planner_rollout_temperature}), the "
                          "temperature the Planner's learned tokens are sampled at")
    _check_ray_learner_dirs(config)


def _check_model_ids(config: MIAConfig) -> None:
    """Every model id (a role's name, an engine's served names) names one thing."""
    seen = {name: f"roles.{name}" for name in config.roles}
    for engine_name, engine in config.engines.items():
        for model_id in engine.served_model_name:
            where = f"engines.{engine_name}.served_model_name"
            if model_id in RESERVED_MODEL_IDS:
                raise ConfigError(f"{where}: {model_id!r} is a reserved model id")
            if model_id in seen:
                raise ConfigError(f"{where}: {model_id!r} is already the model id of {seen[model_id]}")
            seen[model_id] = where


def _check_ray_learner_dirs(config: MIAConfig) -> None:
    """A Planner engine on Ray loads each adapter version on other nodes: the learner's folders must be
    under ``learner.shared_dirs`` (a publish tmpfs never is)."""
    planner = config.agent.roles.planner
    role = resolve_role(config, planner)[1] if planner in config.roles else None
    if role is None or not role.adapter or config.engines[role.engine].executor_backend != "ray":
        return  # no adapter (nothing is learned) or a local engine
    engine, learner = role.engine, config.learner
    where = f"the Planner's engine {engine} runs on Ray workers on other nodes, which"
    if learner.publish_tmpfs and not learner.publish_dir:
        raise ConfigError(f"learner.publish_tmpfs: {where} cannot read a tmpfs of this machine; leave it empty "
                          "and set learner.publish_dir to a folder listed in learner.shared_dirs")
    shared = [Path(d).expanduser().resolve() for d in learner.shared_dirs]
    adapters = config.resolved_data_dir() / "adapters"
    published = Path(learner.publish_dir).expanduser() if learner.publish_dir else adapters / "published"
    for field, folder, what in (("learner.publish_dir", published, "its new adapter versions"),
                                ("data_dir", adapters / planner, "its checkpoints (restart, rollback)")):
        if not any(folder.resolve().is_relative_to(d) for d in shared):
            raise ConfigError(f"{field}: {where} cannot read {what} in {folder} on this machine; put that folder "
                              "on one every node mounts at the same path, listed in learner.shared_dirs")


def _check_role(config: MIAConfig, name: str, role: RoleConfig) -> None:
    prefix = f"roles.{name}"
    if role.alias_of:
        target = config.roles.get(role.alias_of)
        if target is None:
            raise ConfigError(f"{prefix}.alias_of: unknown role {role.alias_of!r}")
        if target.alias_of:
            raise ConfigError(f"{prefix}.alias_of: {role.alias_of!r} is itself an alias")
        return
    if role.engine not in config.engines:
        raise ConfigError(f"{prefix}.engine: unknown engine {role.engine!r}")
    if role.adapter and not config.engines[role.engine].enable_lora:
        raise ConfigError(f"{prefix}.adapter: engine {role.engine!r} has enable_lora = false")


def planner_engine(config: MIAConfig) -> str:
    """The engine the agent's Planner runs on: ``agent.roles.planner`` names a role (followed through its
    alias) or an engine."""
    planner = config.agent.roles.planner
    return resolve_role(config, planner)[1].engine if planner in config.roles else planner


def resolve_role(config: MIAConfig, name: str) -> tuple[str, RoleConfig]:
    """Follow an alias: ``judge`` -> (``manager``, manager's config)."""
    role = config.roles[name]
    if role.alias_of:
        return role.alias_of, config.roles[role.alias_of]
    return name, role
