"""vLLM's engine arguments as fields of an engine table, from vLLM itself: ``vllm_engine_args.json`` holds
every ``AsyncEngineArgs`` field that ``vllm serve`` has a flag for (its flag, type, default and help),
written from the installed vLLM by ``scripts/vllm_engine_args.py``, and ``VllmEngineArgs`` is built from
it. So ``[engines.<name>]`` takes ``quantization = "fp8"`` or ``kv_cache_dtype = "fp8"`` in vLLM's own
spelling, typed and documented as vLLM has them, and reading a config never imports vLLM. A test fails
when the file and the installed vLLM differ (``tests/config/test_vllm_args.py``).

A few arguments are set from an engine field of ours instead (``SET_FROM``), and ``EngineConfig``
(``engines.py``) gives a handful of them other defaults, each saying why.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import msgspec

from ..base.structs import Frozen

ENGINE_ARGS_FILE = Path(__file__).with_name("vllm_engine_args.json")

SET_FROM: Mapping[str, str] = MappingProxyType({
    "disable_log_stats": "the engine: vLLM's stat loggers always run (they feed /metrics)",
    "device_ids": "devices",
    "distributed_executor_backend": "executor_backend",
    "structured_outputs_config": "structured_outputs_backend",
    "limit_mm_per_prompt": "max_images_per_prompt",
    "additional_config": "the cpu_* fields",
})
"""vLLM engine arguments that are not fields of their own: what sets each one instead."""

_TYPES: Mapping[str, Any] = MappingProxyType({
    "bool": bool, "int": int, "float": float, "str": str, "list[str]": list[str], "list[int]": list[int],
    "table": dict[str, Any]})


def _read() -> tuple[str, dict[str, dict[str, Any]]]:
    data = json.loads(ENGINE_ARGS_FILE.read_text())
    return data["vllm_version"], {name: spec for name, spec in data["fields"].items() if name not in SET_FROM}


VLLM_VERSION, ENGINE_ARGS = _read()
"""The vLLM release the file was written from, and each engine argument's spec (``flag``, ``type``,
``choices``, ``default``, ``help``)."""


def _field(name: str, spec: Mapping[str, Any]) -> tuple[str, Any, Any]:
    kind = spec["type"].rstrip("?")
    if kind == "literal":
        tp = Literal[tuple(spec["choices"])]
    else:
        tp = functools.reduce(operator.or_, (_TYPES[part] for part in kind.split(" | ")))
    if spec["type"].endswith("?"):
        tp = tp | None
    default = spec["default"]
    if isinstance(default, (list, dict)) and default:
        default = msgspec.field(default_factory=lambda value=default: json.loads(json.dumps(value)))
    return name, tp, default


VllmEngineArgs = msgspec.defstruct(
    "VllmEngineArgs", [_field(name, spec) for name, spec in ENGINE_ARGS.items()], bases=(Frozen,),
    module=__name__, kw_only=True, frozen=True, forbid_unknown_fields=True,
    namespace={"__doc__": f"vLLM's engine arguments (vLLM {VLLM_VERSION}'s ``AsyncEngineArgs``, as ``vllm serve`` "
                          "takes them), with vLLM's defaults.",
               "__field_docs__": MappingProxyType({name: f"{spec['help']} (vLLM's ``{spec['flag']}``)"
                                                   for name, spec in ENGINE_ARGS.items()})})
"""The base of ``EngineConfig``: one field per vLLM engine argument."""


def vllm_engine_args(engine: msgspec.Struct, own: frozenset[str]) -> dict[str, Any]:
    """The vLLM engine arguments ``engine`` sets to something other than vLLM's default, except the fields
    in ``own`` (the engine passes those itself, converted)."""
    args = {}
    for name, spec in ENGINE_ARGS.items():
        value = getattr(engine, name)
        if name not in own and msgspec.to_builtins(value) != spec["default"]:
            args[name] = value
    return args
