"""``serve``'s preflight of the engines: each model resolves and each ``tool_call_parser`` and
``reasoning_parser`` is vLLM's (before any start; the engine tables' vLLM arguments were checked when the
config was read)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError, MIAConfig
from ..engines.tool_parsers import check_parser_names
from ..models.embedded import is_embedded


def check_engines(config: MIAConfig, model_dir: Callable[[str], Path]) -> None:
    """Raise ``ConfigError`` naming the field: an ``engines.<name>.model`` that is neither a folder nor a
    cached Hugging Face id (embedded models are built at start, not here)."""
    for name, engine in config.engines.items():
        if is_embedded(engine.model):
            continue
        try:
            model_dir(engine.model)
        except FileNotFoundError as err:
            raise ConfigError(f"engines.{name}.model: {err}") from None


def check_engine_parsers(config: MIAConfig) -> None:
    """Raise ``ConfigError`` naming an ``engines.<name>.tool_call_parser`` or ``reasoning_parser`` vLLM does
    not register. The preflight runs it after the checks that need no vLLM: importing vLLM's parser
    registries logs on some platforms (a CPU build without Triton's CPU backend), which would otherwise come
    before their errors."""
    try:
        check_parser_names(config)
    except ValueError as err:
        raise ConfigError(str(err)) from None
