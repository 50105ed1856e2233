"""What every config struct is built from: a frozen struct that refuses unknown fields, and the one
validation helper its ``__post_init__`` uses (part of the config layer: it imports nothing of the package)."""

from __future__ import annotations

import msgspec


def require(condition: bool, message: str) -> None:
    """Validation in one place: msgspec turns this ValueError into a ValidationError naming the struct."""
    if not condition:
        raise ValueError(message)


class Frozen(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of the config structs: immutable, and a misspelt TOML key is an error, not a silent default."""
