#!/usr/bin/env python3
"""Write ``mia_engine/config/vllm_engine_args.json`` from the installed vLLM: every engine argument that
``vllm serve`` has a flag for (``AsyncEngineArgs``' fields), with its flag, the type a TOML value takes,
vLLM's default and vLLM's own help text. ``config/vllm_args.py`` builds the engine table's vLLM fields from
it, so they are vLLM's, not a hand-kept copy, without importing vLLM to read a config;
``tests/config/test_vllm_args.py`` fails when the file differs from what the installed vLLM gives (move
vLLM, then run this). Usage: ``python scripts/vllm_engine_args.py [--check]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "mia_engine" / "config" / "vllm_engine_args.json"
SIMPLE = {bool: "bool", int: "int", float: "float", str: "str"}


def toml_type(hint: Any) -> tuple[str, list[Any] | None]:
    """(type name, choices) of a vLLM field as a config value: ``bool``/``int``/``float``/``str``, a
    ``list[...]`` of those, ``literal`` with its choices, or ``table`` (a dict or a vLLM config class, passed
    to vLLM as a dict, as its ``--x-config`` JSON flags take); ``?`` marks an optional one."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        name, choices = toml_type(rest[0]) if len(rest) == 1 else _union(rest)
        return (name if name.endswith("?") else name + "?"), choices
    if origin is typing.Literal and all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in args):
        return "literal", list(args)
    if origin in (list, set, frozenset, tuple) and args and args[0] in SIMPLE:
        return f"list[{SIMPLE[args[0]]}]", None
    if hint in SIMPLE:
        return SIMPLE[hint], None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "literal", [member.value for member in hint]
    if origin is dict or hint is dict or dataclasses.is_dataclass(hint) or hasattr(hint, "model_fields"):
        return "table", None
    return "object", None  # a Python type no config value can be (torch.dtype, a callable)


def _union(args: list[Any]) -> tuple[str, list[Any] | None]:
    """A union of several types as the union of their config types (``str | list[str]``, ``str | table``); a
    literal among them is its values' type, and a type no config value can be is left out."""
    names = set()
    for arg in args:
        name, choices = toml_type(arg)
        name = name.rstrip("?")
        if name == "literal":
            name = "str" if all(isinstance(choice, str) for choice in choices or []) else "int"
        if name != "object":
            names.add(name)
    return " | ".join(sorted(names)) or "table", None


def default_of(field: dataclasses.Field, kind: str) -> Any:
    """vLLM's default as a TOML-able value; None where it is a config object (vLLM builds its own)."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return None
    if isinstance(value, (set, frozenset, tuple)):
        value = sorted(value) if kind.startswith("list") else list(value)
    try:
        json.dumps(value)
    except TypeError:
        return None
    return value if kind.rstrip("?") != "table" or value is None else (value or None)


def first_paragraph(text: str | None) -> str:
    """vLLM's help as one paragraph: its first one (with the next where it ends in a colon), without the
    API-docs link lines."""
    paragraphs = [" ".join(p.split()) for p in (text or "").split("\n\n")]
    kept = [p for p in paragraphs if p and not p.startswith("API docs:")]
    if len(kept) > 1 and kept[0].endswith(":"):  # "Tokenizer mode:" and the list that follows
        return f"{kept[0]} {kept[1]}"
    return kept[0] if kept else ""


def _type_hints(cls: type) -> dict[str, Any]:
    """Each field's type, evaluated one by one: a name vLLM imports only for type checkers makes that one
    field a table, not the whole class unreadable."""
    module = vars(sys.modules[cls.__module__])
    hints = {}
    for field in dataclasses.fields(cls):
        try:
            hints[field.name] = eval(field.type, module) if isinstance(field.type, str) else field.type
        except NameError:
            hints[field.name] = dict
    return hints


def collect() -> dict[str, Any]:
    sys.argv = [sys.argv[0], "serve", "--help"]  # vLLM reads its help texts only when help is asked for
    from vllm import __version__
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    actions = {action.dest: action for action in parser._actions}
    hints = _type_hints(AsyncEngineArgs)
    fields = {}
    for field in dataclasses.fields(AsyncEngineArgs):
        action = actions.get(field.name)
        if action is None or not action.option_strings:
            continue  # no `vllm serve` flag: not a user's setting
        kind, choices = toml_type(hints[field.name])
        kind = kind.replace("object", "table")
        default = default_of(field, kind)
        if default is None and not kind.endswith("?"):
            kind += "?"
        long_flags = [o for o in action.option_strings if o.startswith("--")]
        fields[field.name] = {"flag": long_flags[0], "aliases": [o for o in action.option_strings if o != long_flags[0]],
                              "type": kind, "choices": choices, "default": default,
                              "help": first_paragraph(action.help)}
    return {"vllm_version": __version__, "fields": fields}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the installed vLLM's")
    args = parser.parse_args()
    text = json.dumps(collect(), indent=1, sort_keys=True) + "\n"
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.name}: {'up to date' if same else 'differs from the installed vLLM: run scripts/vllm_engine_args.py'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(json.loads(text)['fields'])} engine arguments)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
