"""``--lora-modules``: extra LoRA adapters served by name on a base model's engine, as ``vllm serve
--lora-modules`` takes them, turned into dotted config overrides of roles.

Each adapter becomes a role of its own (a model id = an engine + an adapter + default sampling; the
research agent never uses it): ``roles.<name>.engine`` and ``roles.<name>.adapter``. A value is vLLM's
``name=path`` or its JSON form ``{"name": ..., "path": ..., "base_model_name": ...}`` (a JSON list of such
objects is taken too, as vLLM's help text says). ``base_model_name`` is a model id of the engine's bare base
model (its table name, or one of its ``served_model_name``); without it the adapter goes on the default
engine (``default_lora_engine``: the Planner's, or the only one). A name that is a role of the config
replaces that role's engine and adapter, as ``--roles.<name>.adapter`` would."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import msgspec

from .errors import ConfigError
from .root import RESERVED_MODEL_IDS, MIAConfig, planner_engine

FLAG = "--lora-modules"
MAX_NAME_CHARS = 256
"""Longest adapter name (a model id) taken; vLLM sets none, but a name is logged and labels metrics."""
_FIELDS = ("name", "path", "base_model_name", "is_3d_lora_weight")
"""vLLM's ``LoRAModulePath`` fields, in its order."""


def lora_module_overrides(values: Sequence[str], config_engines: Sequence[str] | Mapping[str, Sequence[str]],
                          default_engine: str) -> dict[str, object]:
    """The dotted overrides (``roles.<name>.engine``, ``roles.<name>.adapter``) serving each
    ``--lora-modules`` value. ``config_engines``: the config's engine names, or engine name -> the model ids
    of its bare base model (``EngineConfig.model_ids``), which ``base_model_name`` may name too.
    ``default_engine``: the engine of an adapter that names no base model. Raises ``ConfigError`` (one line)
    for a malformed value, a name given twice, a name that is a reserved model id (``mia``, ``embedding``)
    or a base model's, and a ``base_model_name`` no engine serves."""
    engines = ({name: list(ids) or [name] for name, ids in config_engines.items()}
               if isinstance(config_engines, Mapping) else {name: [name] for name in config_engines})
    base_ids = {model_id: engine for engine, ids in engines.items() for model_id in [engine, *ids]}
    overrides: dict[str, object] = {}
    seen: set[str] = set()
    for value in values:
        for name, path, base in _entries(value):
            _check_name(value, name, base_ids)
            if name in seen:
                raise ConfigError(f"{FLAG}: {name!r} is given twice")
            seen.add(name)
            overrides[f"roles.{name}.engine"] = _engine(value, name, base, base_ids, default_engine)
            overrides[f"roles.{name}.adapter"] = path
    return overrides


def default_lora_engine(config: MIAConfig) -> str:
    """The engine an adapter goes on when it names no base model: the only engine, else the Planner's (the
    engine of ``agent.roles.planner``: a role's, or the engine it names); empty when neither is known."""
    if len(config.engines) == 1:
        return next(iter(config.engines))
    return planner_engine(config)


def _entries(value: str) -> list[tuple[str, str, str]]:
    """(name, path, base_model_name or "") of one flag value; parsed as vLLM's ``LoRAParserAction`` does."""
    if not value:
        return []  # vLLM skips empty values
    if "=" in value and "," not in value and not value.lstrip().startswith(("{", "[")):
        name, path = value.split("=", 1)
        return [(name, _non_empty(value, "path", path), "")]
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise ConfigError(f"{FLAG}: {value!r} is neither name=path nor JSON") from None
    objects = parsed if isinstance(parsed, list) else [parsed]
    return [_entry(value, item) for item in objects]


def _entry(value: str, item: object) -> tuple[str, str, str]:
    if not isinstance(item, dict):
        raise ConfigError(f"{FLAG}: {value!r}: expected a JSON object with name and path")
    unknown = sorted(set(item) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{FLAG}: {value!r}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    try:
        name, path, base, is_3d = msgspec.convert(
            [item.get("name"), item.get("path"), item.get("base_model_name") or "",
             item.get("is_3d_lora_weight", False)], tuple[str, str, str, bool])
    except msgspec.ValidationError:
        raise ConfigError(f"{FLAG}: {value!r}: name and path must be strings, base_model_name a string, "
                          "is_3d_lora_weight a boolean") from None
    if is_3d:
        raise ConfigError(f"{FLAG}: {value!r}: 3D (MoE) LoRA weights are not supported")
    return name, _non_empty(value, "path", path), base


def _non_empty(value: str, field: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(f"{FLAG}: {value!r}: the {field} is empty")
    return text


def _check_name(value: str, name: str, base_ids: Mapping[str, str]) -> None:
    """A name usable as a model id and as a dotted config key."""
    problem = check_model_id(name)
    if problem is None and "." in name:
        problem = "contains '.', which a dotted config key (roles.<name>.adapter) cannot hold"
    if problem is None and name in RESERVED_MODEL_IDS:
        problem = "is a reserved model id"
    if problem is None and name in base_ids:
        problem = f"is the model id of engine {base_ids[name]!r}'s base model"
    if problem is not None:
        raise ConfigError(f"{FLAG}: {value!r}: the name {name!r} {problem}")


def check_model_id(name: str) -> str | None:
    """Why ``name`` cannot be a served model id (None: it can): empty, too long, or with whitespace or
    control characters (an id is logged and labels metrics)."""
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"is longer than {MAX_NAME_CHARS} characters"
    if any(char.isspace() or not char.isprintable() for char in name):
        return "holds whitespace or control characters"
    return None


def _engine(value: str, name: str, base: str, base_ids: Mapping[str, str], default_engine: str) -> str:
    if base:
        if base not in base_ids:
            raise ConfigError(f"{FLAG}: {value!r}: base_model_name {base!r} is not a base model of this config "
                              f"(engines and their served names: {', '.join(sorted(base_ids))})")
        return base_ids[base]
    if default_engine not in base_ids.values():
        raise ConfigError(f"{FLAG}: {value!r}: name the engine of {name!r} with base_model_name (one of "
                          f"{', '.join(sorted(base_ids))})")
    return default_engine
