"""The request fields a route does not know: logged (as vLLM logs them) instead of dropped without a word.

Unknown fields are accepted, so that newer clients keep working; a warning names them, so that a field
the caller relies on (a vLLM extension this server does not implement) is visible in the server log. The
names are the client's: the warning shows the first ``MAX_LOGGED_NAMES``, each escaped and bounded
(``base/log_text.py``), and counts the rest, so a name cannot forge a log line nor a body of keys write one
of megabytes.
"""

from __future__ import annotations

import logging

import msgspec

from ..base.log_text import bounded_names

log = logging.getLogger(__name__)

_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def warn_ignored(route: str, body: bytes | bytearray, struct_type: type[msgspec.Struct]) -> None:
    """Log the top-level keys of ``body`` (an already validated JSON object) that ``struct_type`` lacks."""
    try:
        keys = _KEYS.decode(body)
    except (msgspec.DecodeError, RecursionError):  # validated already (depth: this call's stack differs); nothing to say
        return
    known = set(struct_type.__struct_fields__)
    ignored = [key for key in keys if key not in known]  # in the body's order: no sort of a million keys
    if ignored:
        log.warning("%s: the request's fields %s are not supported here and were ignored", route,
                    bounded_names(ignored))
