"""Reading a config: a TOML file (``configs/*.toml``; the bundled ones are found by name) plus command-line
overrides, converted into ``MIAConfig`` (each section checks itself) and then checked across sections
(``root.check_sections``). A problem is one ``ConfigError`` line that names the field, e.g.
``roles.judge.alias_of: unknown role 'boss'``."""

from __future__ import annotations

import difflib
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from ..base.keys import KeyFileError, read_key_file
from .agent import resolve_table
from .engines import EngineConfig
from .errors import ConfigError, field_message
from .roles import RoleConfig
from .served_model import ModelFacts, with_model
from .root import MIAConfig, check_sections
from .vllm_args import VLLM_VERSION


def bundled_config(name: str) -> Path | None:
    """The config shipped under ``configs/`` with this name (``default``, ``tiny``, ``8xgpu``), if any."""
    candidate = resources.files("mia_engine.configs") / f"{name}.toml"
    return Path(str(candidate)) if candidate.is_file() else None


def read_toml(name_or_path: str) -> dict[str, Any]:
    path = bundled_config(name_or_path) if "/" not in name_or_path and not name_or_path.endswith(".toml") else None
    path = path or Path(name_or_path).expanduser()
    if not path.is_file():
        raise ConfigError(f"--config: no such file or bundled config: {name_or_path!r}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None


def parse_override_value(text: str) -> Any:
    """A TOML value (``8``, ``true``, ``[0, 1]``, ``"x"``), or the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``raw[a][b][c] = value`` for ``dotted = "a.b.c"``, creating tables on the way; a ``*`` key sets
    it in every table there is at that place (``engines.*.max_model_len``: on every engine)."""
    _apply(raw, dotted.split("."), value, dotted)


def _apply(node: dict[str, Any], keys: list[str], value: Any, dotted: str) -> None:
    if keys[0] == "*" and len(keys) > 1:
        for child in node.values():
            if isinstance(child, dict):
                _apply(child, keys[1:], value, dotted)
        return
    if len(keys) == 1:
        node[keys[0]] = value
        return
    child = node.setdefault(keys[0], {})
    if not isinstance(child, dict):
        done = dotted.split(".")[: dotted.split(".").index(keys[0]) + 1]
        raise ConfigError(f"{'.'.join(done)}: is a value, cannot set {dotted}")
    _apply(child, keys[1:], value, dotted)


def load_config(name_or_path: str | None, overrides: dict[str, Any] | None = None, *,
                model: ModelFacts | None = None, served_names: list[str] | None = None) -> MIAConfig:
    """Read, override, convert and cross-check a config; raise ``ConfigError`` naming the field.
    ``name_or_path`` None: the ``default`` config, or with ``model`` (``serve MODEL``) the one-model config
    of ``served_model.py``; a config and ``model``: that config with its Planner's engine on the model."""
    raw = read_toml(name_or_path or "default") if name_or_path or model is None else None
    if model is not None:
        raw = with_model(raw, model, read_toml("default"), served_names)
    for dotted, value in (overrides or {}).items():
        apply_override(raw, dotted, value)
    _check_named_tables(raw)
    _resolve_agent_table(raw)
    try:
        config = msgspec.convert(raw, MIAConfig)
    except msgspec.ValidationError as err:
        raise ConfigError(field_message(err)) from None
    config = _with_key_files(config)
    check_sections(config)
    return config


def _with_key_files(config: MIAConfig) -> MIAConfig:
    """Read ``api_key_file`` / ``admin_api_key_file`` into the keys (a key given directly wins)."""
    server = config.server
    keys = {}
    for field in ("api_key", "admin_api_key"):
        path = getattr(server, f"{field}_file")
        if path and not getattr(server, field):
            try:
                keys[field] = read_key_file(f"server.{field}_file", Path(path).expanduser())
            except KeyFileError as err:
                raise ConfigError(str(err)) from None
    if not keys:
        return config
    return msgspec.structs.replace(config, server=msgspec.structs.replace(server, **keys))


def _check_named_tables(raw: dict[str, Any]) -> None:
    """Convert ``[engines.X]`` / ``[roles.X]`` one by one, so that an error names X (msgspec says ``[...]``)."""
    for section, struct in (("engines", EngineConfig), ("roles", RoleConfig)):
        tables = raw.get(section)
        if not isinstance(tables, dict):
            continue
        for name, table in tables.items():
            try:
                msgspec.convert(table, struct)
            except msgspec.ValidationError as err:
                unknown = re.fullmatch(r"Object contains unknown field `([^`]+)`", str(err))
                if section == "engines" and unknown:
                    raise ConfigError(_unknown_engine_key(name, unknown[1])) from None
                raise ConfigError(field_message(err, f"{section}.{name}")) from None


def _unknown_engine_key(name: str, key: str) -> str:
    """An engine key that is neither ours nor vLLM's, with the closest one that is (vLLM's spelling)."""
    close = difflib.get_close_matches(key, EngineConfig.__struct_fields__, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"engines.{name}.{key}: not an engine field nor an engine argument of vLLM {VLLM_VERSION}{hint}"


def _resolve_agent_table(raw: dict[str, Any]) -> None:
    """``[agent]`` with its profile expanded (``agent.py: resolve_table``)."""
    if isinstance(raw.get("agent"), dict):
        try:
            raw["agent"] = resolve_table(raw["agent"])
        except ValueError as err:
            raise ConfigError(str(err)) from None
