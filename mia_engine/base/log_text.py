"""Text a client chose (a path, a field name, a model or adapter name), made safe to put in a log record:
escaped so that it can neither forge a record nor steer a terminal, and bounded so that one request cannot
write a megabyte line.

``printable`` escapes every character ``str.isprintable`` refuses, which takes in what log readers split
lines at (``\\n``, ``\\r``, vertical tab, form feed, ``\\x1c``-``\\x1e``, NEL, U+2028/U+2029), the terminal
controls (ESC and the rest of C0 and C1) and the invisible format characters, bidirectional overrides
included (they reorder what a reader sees); and the backslash, so that an escape in the log is never
mistaken for one the client typed. ``bounded_names`` logs a list the client sized (unknown fields) as its
first few names and a count. ``LINE_BREAKING`` is what a formatter escapes in any record, whoever wrote it
(``base/logs.py``). Part of the config layer (it imports nothing of the package).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_LOGGED_CHARS = 200
"""Characters one client-chosen value takes in a log line at most (escapes counted), then a marker with how
many were left out: a path or a name is recognisable in 200, and a line stays one screen line or two."""
MAX_LOGGED_NAMES = 20
"""Names of a client-sized list (the unknown fields of a request) a log line shows; the rest is counted."""
MAX_LOGGED_NAME_CHARS = 64
"""Characters of each of those names: a field name is short, a long one is a payload."""

LINE_BREAKING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What any record escapes, whoever wrote it: control characters but tab and newline (which a formatter
handles itself), the line and paragraph separators, and the bidirectional marks and overrides."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escape_char(char: str) -> str:
    """``\\n``, ``\\r``, ``\\t``, ``\\\\``, else ``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH`` (as Python writes them)."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, max_chars: int = MAX_LOGGED_CHARS) -> str:
    """``text`` for a log line: its unprintable characters and backslashes escaped, at most ``max_chars``
    characters (escapes counted) and, where it was longer, ``...(+N chars)`` for the ``N`` left out. Reads
    at most ``max_chars`` characters of ``text``, however long it is."""
    if len(text) <= max_chars and text.isprintable() and "\\" not in text:
        return text
    pieces, used = [], 0
    for index, char in enumerate(text):
        piece = char if char.isprintable() and char != "\\" else escape_char(char)
        if used + len(piece) > max_chars:
            return "".join(pieces) + f"...(+{len(text) - index} chars)"
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces)


def bounded_names(names: Sequence[str], max_names: int = MAX_LOGGED_NAMES,
                  max_chars: int = MAX_LOGGED_NAME_CHARS) -> str:
    """The first ``max_names`` of ``names``, each ``printable`` within ``max_chars`` and quoted, comma
    separated, then ``and N more`` for the rest."""
    shown = ", ".join(f"'{printable(name, max_chars)}'" for name in names[:max_names])
    rest = len(names) - max_names
    return f"{shown} and {rest} more" if rest > 0 else shown
