"""Configuration as a package, one module per section at the bottom of the tree (it imports nothing of
the engine but ``base/``): ``server.py``, ``engines.py``, ``roles.py``, ``agent.py`` (the research loop),
``tools.py``, ``memory.py``, ``learner.py``, ``gpus.py`` (the dry run's hardware). Each section is a frozen
msgspec struct that checks its own fields in ``__post_init__``; ``root.py`` gathers them in ``MIAConfig``
and keeps the rules that span sections; ``loader.py`` reads a TOML file plus overrides; ``errors.py``
says how a problem is reported (one line naming the field). What the rest of the package uses is named
here."""

from .engines import EngineConfig, ModelsConfig
from .errors import ConfigError
from .learner import LearnerConfig
from .loader import apply_override, bundled_config, load_config, parse_override_value, read_toml
from .roles import RoleConfig, SamplingDefaults
from .root import AGENT_MODEL, EMBEDDING_MODEL, RESERVED_MODEL_IDS, MIAConfig, planner_engine, resolve_role
from .server import (AdmissionConfig, ConnectionsConfig, ImageInputConfig, LimitsConfig, ServerConfig, check_adapter_dirs, check_bind,
                     check_keys, is_loopback_host)

__all__ = ["AGENT_MODEL", "EMBEDDING_MODEL", "RESERVED_MODEL_IDS", "AdmissionConfig", "ConfigError", "ConnectionsConfig", "EngineConfig",
           "ImageInputConfig", "LearnerConfig", "LimitsConfig", "MIAConfig", "ModelsConfig", "RoleConfig",
           "SamplingDefaults", "ServerConfig", "apply_override", "bundled_config", "check_adapter_dirs", "check_bind",
           "check_keys", "is_loopback_host", "load_config", "parse_override_value", "planner_engine", "read_toml",
           "resolve_role"]
