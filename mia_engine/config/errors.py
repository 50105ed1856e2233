"""How a config problem is reported: one line that names the field, e.g. ``server.port: 70000 is not a TCP
port``. A struct checks its own fields in ``__post_init__`` with ``check_field``; msgspec adds where the
struct sits (``$.server``) and ``field_message`` joins the two into the dotted name."""

from __future__ import annotations

import msgspec

from ..base.structs import require


class ConfigError(ValueError):
    """An invalid configuration; the message is one line that names the field."""


def check_field(condition: bool, field: str, problem: str) -> None:
    """Refuse ``field`` of the struct being checked. The message starts with ``.field:``, which
    ``field_message`` joins to the struct's own path; built in Python, the struct raises it as it is."""
    require(condition, f".{field}: {problem}")


def check_positive(field: str, value: int | float) -> None:
    """A count is at least 1; a quantity in a unit (seconds, GiB) is above 0."""
    if isinstance(value, float):
        check_field(value > 0, field, f"must be > 0, got {value}")
    else:
        check_field(value >= 1, field, f"must be >= 1, got {value}")


def check_non_negative(field: str, value: int | float, zero_means: str) -> None:
    check_field(value >= 0, field, f"must be >= 0 (0 = {zero_means})")


def field_message(err: msgspec.ValidationError, prefix: str = "") -> str:
    """``"Expected `int`, got `str` - at `$.a.b`"`` -> ``"prefix.a.b: Expected `int`, got `str`"``, and a
    ``check_field`` message ``".c: problem - at `$.a`"`` -> ``"prefix.a.c: problem"``."""
    message, _, path = str(err).partition(" - at `$")
    path = ".".join(p for p in (prefix, path.rstrip("`").lstrip(".")) if p)
    if message.startswith("."):
        return f"{path}{message}" if path else message[1:]
    return f"{path}: {message}" if path else message
