"""vLLM's engine flags on ``serve``'s command line, in vLLM's spelling: ``--tensor-parallel-size 2``,
``--max-model-len 8192``, ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``, ... One flag per
engine argument of ``vllm_engine_args.json`` (so a vLLM release that adds an argument adds its flag), plus
the three of ``vllm serve``'s own flags that set an engine field of ours (``FRONTEND_FIELDS``). A flag sets
its field on every engine of the config (``engines.*.<field>``); ``--engines.NAME.<field>`` sets one."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..base.config_docs import field_docs, plain
from .engines import EngineConfig
from .loader import parse_override_value
from .vllm_args import ENGINE_ARGS, VLLM_VERSION

EVERY_ENGINE = "engines.*"
"""The override prefix that sets a field on every engine table of the config (``loader.apply_override``)."""

FRONTEND_FIELDS: Mapping[str, str] = MappingProxyType({
    "--chat-template": "chat_template", "--tool-call-parser": "tool_call_parser",
    "--enable-auto-tool-choice": "enable_auto_tool_choice"})
"""``vllm serve`` flags that are not engine arguments in vLLM but are engine fields here (per engine: each
engine serves its own model family)."""

_DEST_PREFIX = "engine_flag__"


def engine_flags() -> dict[str, str]:
    """Every engine flag (vLLM's spelling) -> the engine field it sets."""
    flags = {spec["flag"]: name for name, spec in ENGINE_ARGS.items()}
    return {**flags, **FRONTEND_FIELDS}


def _aliases(field: str) -> list[str]:
    """vLLM's other spellings of a field's flag (``-tp``, ``--device-memory-utilization``); the ``--no-``
    forms come with the boolean action."""
    spec = ENGINE_ARGS.get(field)
    return [a for a in (spec or {}).get("aliases", []) if not a.startswith("--no-")]


def human_readable_int(text: str) -> int:
    """An int as vLLM's flags take one: ``32768``, ``32k`` (decimal: 32000) or ``32K`` (binary: 32768)."""
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer (e.g. 8192 or 8k), got {text!r}") from None


def add_engine_flags(parser: argparse.ArgumentParser, taken: set[str]) -> None:
    """The engine flags as an argument group of ``parser`` (``taken``: option strings it already has, which
    keep their meaning)."""
    group = parser.add_argument_group(
        f"vLLM engine arguments (vLLM {VLLM_VERSION}'s spelling; each sets its field on every engine, "
        "--engines.NAME.<field> on one; `config show` lists the fields)")
    for flag, field in sorted(engine_flags().items()):
        flags = [f for f in (flag, *_aliases(field)) if f not in taken]
        if flag in taken:
            continue
        spec = ENGINE_ARGS.get(field)
        dest = _DEST_PREFIX + field
        doc = _help(field)
        kind = spec["type"].rstrip("?") if spec else _own_type(field)
        if kind == "bool":
            group.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=doc)
        elif kind in ("list[str]", "list[int]", "list[str] | str"):
            group.add_argument(*flags, dest=dest, nargs="+", type=int if kind == "list[int]" else str,
                               default=argparse.SUPPRESS, metavar="VALUE", help=doc)
        elif kind == "literal":
            choices = spec["choices"]
            listed = "{" + ",".join(map(str, choices)) + "}"
            group.add_argument(*flags, dest=dest, type=type(choices[0]), choices=choices, default=argparse.SUPPRESS,
                               metavar=listed if len(listed) <= 60 else "NAME", help=doc)
        else:
            group.add_argument(*flags, dest=dest, type=_CONVERTERS.get(kind, parse_override_value),
                               default=argparse.SUPPRESS, metavar=kind.upper().replace(" ", ""), help=doc)


def engine_flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given, as config overrides of every engine (``engines.*.<field>``)."""
    return {f"{EVERY_ENGINE}.{dest.removeprefix(_DEST_PREFIX)}": value for dest, value in vars(args).items()
            if dest.startswith(_DEST_PREFIX)}


def _own_type(field: str) -> str:
    annotation = EngineConfig.__annotations__[field]
    return {"bool": "bool", "str": "str"}.get(getattr(annotation, "__name__", str(annotation)), "str")


def _help(field: str) -> str:
    """The field's first sentence (ours where ``EngineConfig`` redefines it, else vLLM's), for argparse."""
    first = plain(field_docs(EngineConfig).get(field, "")).split(". ")[0].rstrip(".")
    return f"{first} (engines.*.{field})".replace("%", "%%")


def _table(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None


_CONVERTERS = MappingProxyType({"int": human_readable_int, "float": float, "str": str, "table": _table})
