"""Each config field's documentation, read from the config structs themselves, for ``config show`` (the
effective config as commented TOML) and the generated reference ``docs/CONFIG.md`` (``config show
--markdown``). A field is documented once, by the string under it in its struct (an attribute docstring);
a field without one takes its struct's docstring. Part of the config layer: it imports nothing of the
package and works on any tree of msgspec structs.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any

import msgspec

SECRET_SUFFIX = "api_key"
"""Fields whose names end so are shown masked: ``config show`` output is pasted into issues."""
_LITERAL_CODE = re.compile(r"``(.+?)``")


def plain(text: str) -> str:
    """A docstring as one paragraph of text with no reStructuredText: ````x```` becomes ``x``."""
    return _LITERAL_CODE.sub(r"\1", " ".join(inspect.cleandoc(text).split()))


def markdown(text: str) -> str:
    """A docstring as one Markdown paragraph: ````x```` becomes `` `x` ``; table pipes escaped."""
    return _LITERAL_CODE.sub(r"`\1`", " ".join(inspect.cleandoc(text).split())).replace("|", "\\|")


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: its attribute docstring (raw)} of a struct class and its bases (or, for a class built from
    data, its ``__field_docs__``)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not issubclass(klass, msgspec.Struct) or klass is msgspec.Struct:
            continue
        docs.update(vars(klass).get("__field_docs__", {}))  # a struct built from data (defstruct) brings its own
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = after.value.value
    return docs


def field_doc(cls: type, field: msgspec.structs.FieldInfo) -> str:
    """A field's documentation: its own, or its struct type's docstring (e.g. ``server: ServerConfig``)."""
    own = field_docs(cls).get(field.name)
    if own:
        return own
    struct = _struct_type(field.type)
    return struct.__doc__ or "" if struct is not None else ""


@cache
def borrowed_fields(cls: type) -> frozenset[str]:
    """Fields documented by a base built from another project's data (``__field_docs__``: vLLM's engine
    arguments) and not redefined by a class of this one: ``config show`` prints them only where set, and
    the reference lists them in a table of their own."""
    borrowed: set[str] = set()
    for klass in reversed(cls.__mro__):
        data_docs = vars(klass).get("__field_docs__")
        if data_docs is not None:
            borrowed |= set(data_docs)
        else:
            borrowed -= set(vars(klass).get("__annotations__", {}))
    return frozenset(borrowed)


def default_of(field: msgspec.structs.FieldInfo) -> Any:
    """A field's default value, or ``msgspec.NODEFAULT`` for a required one."""
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return msgspec.NODEFAULT


def type_name(tp: Any) -> str:
    """A readable type: ``int``, ``"text" | "json"``, ``list[int]``, ``dict[str, EngineConfig]``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        inner = ", ".join("..." if arg is Ellipsis else type_name(arg) for arg in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def toml_value(value: Any) -> str:
    """A TOML literal for a config value (strings, numbers, booleans, arrays, inline tables)."""
    value = msgspec.to_builtins(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(value)


def render_toml(config: msgspec.Struct) -> str:
    """The effective config as TOML (it loads back), every field preceded by its doc and, where the value
    differs, its default; API keys masked."""
    return "\n".join(_toml_table(config, "")).strip() + "\n"


def _toml_table(struct: msgspec.Struct, path: str) -> Iterator[str]:
    cls = type(struct)
    fields = msgspec.structs.fields(cls)
    if path:
        yield ""
        yield from _comment(cls.__doc__ or "")
        yield f"[{path}]"
    tables = []
    for field in fields:
        value = getattr(struct, field.name)
        if isinstance(value, msgspec.Struct) or _is_struct_map(value):
            tables.append((field, value))
            continue
        default = default_of(field)
        is_default = default is not msgspec.NODEFAULT and msgspec.to_builtins(default) == msgspec.to_builtins(value)
        if field.name in borrowed_fields(cls) and is_default:
            continue
        yield from _comment(field_doc(cls, field))
        if default is not msgspec.NODEFAULT and not is_default:
            yield f"# default: {toml_value(default)}"
        if value is None:  # TOML has no null: the key stays unset
            yield f"# {_toml_key(field.name)} = (none)"
            continue
        shown = '"***"' if field.name.endswith(SECRET_SUFFIX) and value else toml_value(value)
        yield f"{_toml_key(field.name)} = {shown}"
    for field, value in tables:
        where = f"{path}.{_toml_key(field.name)}" if path else _toml_key(field.name)
        if isinstance(value, msgspec.Struct):
            yield from _toml_table(value, where)
        else:
            for name, item in value.items():
                yield from _toml_table(item, f"{where}.{_toml_key(name)}")


def render_markdown(root: type, title: str, intro: str) -> str:
    """The reference of every field under the struct class ``root``: one table per struct (field, type,
    default, what it does), from the classes, not from a loaded config."""
    lines = [f"# {title}", "", intro, ""]
    for path, cls in _struct_classes(root, ""):
        fields = [field for field in msgspec.structs.fields(cls) if _struct_type(field.type) is None]
        own = [field for field in fields if field.name not in borrowed_fields(cls)]
        borrowed = [field for field in fields if field.name in borrowed_fields(cls)]
        lines += [f"## `[{path}]`" if path else "## Top level", "", markdown(cls.__doc__ or ""), ""]
        lines += _field_table(cls, own)
        if borrowed:
            base = next(klass for klass in cls.__mro__ if "__field_docs__" in vars(klass))
            lines += [f"### `[{path}]`: {markdown(base.__doc__ or '')}", ""] + _field_table(cls, borrowed)
    return "\n".join(lines)


def _field_table(cls: type, fields: list[msgspec.structs.FieldInfo]) -> list[str]:
    lines = ["| Field | Type | Default | What it does |", "|---|---|---|---|"]
    for field in fields:
        default = default_of(field)
        shown = "required" if default is msgspec.NODEFAULT else f"`{toml_value(default)}`".replace("|", "\\|")
        kind = type_name(field.type).replace("|", "\\|")
        lines.append(f"| `{field.name}` | `{kind}` | {shown} | {markdown(field_doc(cls, field))} |")
    return lines + [""]


def _struct_classes(cls: type, path: str) -> Iterator[tuple[str, type]]:
    """(dotted table path, struct class) for ``cls`` and every struct under it, depth first."""
    yield path, cls
    for field in msgspec.structs.fields(cls):
        struct = _struct_type(field.type)
        if struct is None:
            continue
        where = f"{path}.{field.name}" if path else field.name
        if typing.get_origin(field.type) is dict:
            where += ".<name>"
        yield from _struct_classes(struct, where)


def _struct_type(tp: Any) -> type | None:
    """The struct class a field holds, directly or as the values of a dict (None: a plain value)."""
    if typing.get_origin(tp) is dict:
        tp = typing.get_args(tp)[1]
    return tp if isinstance(tp, type) and issubclass(tp, msgspec.Struct) else None


def _is_struct_map(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, msgspec.Struct) for v in value.values())


def _comment(doc: str) -> Iterator[str]:
    for line in textwrap.wrap(plain(doc), 100):
        yield f"# {line}"


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
