"""Logging of a command and of the vLLM processes it spawns: one level (``server.log_level``) and one format
(``server.log_format``: readable text, or one JSON object per line) for our loggers, uvicorn's and vLLM's.

vLLM configures its ``vllm`` logger when it is imported, in this process and in each engine process it
spawns, from its documented environment variables: ``VLLM_LOGGING_LEVEL``, and for the JSON format
``VLLM_LOGGING_CONFIG_PATH``, a ``logging.config.dictConfig`` file that routes vLLM's records (and the
root logger's, in the spawned processes) through ``JsonFormatter``. ``configure`` sets them before vLLM
is imported, and applies the level to vLLM's loggers where it already was.

Neither format lets a record's text pass for another record: the text format escapes the characters that
end a line or steer a terminal (``log_text.LINE_BREAKING``) and indents every further line of a record (a
traceback, a multi-line message) by ``CONTINUATION``, so each record starts at column 0 and nothing it
holds does; the JSON format escapes those characters inside its strings too (``json.dumps`` leaves U+2028,
U+2029, DEL and C1 raw, which some readers take for line ends). Part of the config layer (it imports only
``base.log_text``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import MutableMapping
from datetime import datetime, timezone
from pathlib import Path

from .log_text import LINE_BREAKING, escape_char

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
VLLM_LEVEL_ENV = "VLLM_LOGGING_LEVEL"
VLLM_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
CONTINUATION = "    "
"""What starts every line of a text record after its first: a record's own lines read as one block, and a
line at column 0 is always a record's start."""
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What ``json.dumps(ensure_ascii=False)`` leaves raw of ``LINE_BREAKING`` (it escapes C0 itself)."""


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, one record per block: ``LINE_BREAKING`` characters escaped, further lines indented."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = LINE_BREAKING.sub(_escape_match, super().format(record))
        return text.replace("\n", "\n" + CONTINUATION) if "\n" in text else text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, and
    ``exception`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _JSON_RAW.sub(_json_escape, json.dumps(entry, ensure_ascii=False))


def _escape_match(match: re.Match[str]) -> str:
    return escape_char(match.group())


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"  # json.dumps puts them in strings only, where it reads the same


def configure(level: str, log_format: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Log at ``level`` (debug, info, warning, error) in ``log_format`` (text, json) to stderr, here and
    in the vLLM processes spawned from now on (through ``environ``, this process's by default)."""
    environ = os.environ if environ is None else environ
    name = level.upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=name, handlers=[handler], force=True)
    environ[VLLM_LEVEL_ENV] = name
    if log_format == "json":
        logging.captureWarnings(True)
        environ[VLLM_CONFIG_ENV] = str(_write_vllm_config(name))
    _apply_to_vllm(name, handler if log_format == "json" else None)


def vllm_dict_config(level: str) -> dict:
    """The ``dictConfig`` vLLM loads from ``VLLM_CONFIG_ENV`` for the JSON format: its logger and (in the
    processes it spawns, where nothing else sets one up) the root logger, to stderr through ``JsonFormatter``."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
            "handlers": {"json": handler},
            "loggers": {"vllm": {"handlers": ["json"], "level": level, "propagate": False}},
            "root": {"handlers": ["json"], "level": level}}


def _write_vllm_config(level: str) -> Path:
    """A file for ``VLLM_CONFIG_ENV`` (vLLM reads only a path); one small file per start, in the temp folder."""
    with tempfile.NamedTemporaryFile("w", prefix="mia-engine-logging-", suffix=".json", delete=False) as file:
        json.dump(vllm_dict_config(level), file)
    return Path(file.name)


def _apply_to_vllm(level: str, handler: logging.Handler | None) -> None:
    """Where vLLM was imported already (it configured its logger then), its logger takes ``level`` now, and
    ``handler`` (the JSON one) when given."""
    if "vllm.logger" not in sys.modules:
        return
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.setLevel(level)
    if handler is not None:
        vllm_logger.handlers = [handler]
    for existing in vllm_logger.handlers:
        existing.setLevel(level)
