"""Command line: ``python -m mia_engine serve [--config NAME|PATH] [--host] [--port] [--api-key]
[--data-dir] [--dotted.field=VALUE ...]``, in the style of ``vllm serve``.

Any config field can be overridden with its dotted path, e.g. ``--engines.smollm2.max_model_len=8192``
or ``--roles.planner.sampling.temperature 0.7``; values are read as TOML (``8``, ``true``, ``[0, 1]``)
or else as strings. A bad flag or config exits with one line that names the field.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from .config import ConfigError, MIAConfig, load_config, parse_override_value

PROG = "python -m mia_engine"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="MIA Engine: the Memory Intelligence Agent on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the roles (and the agent) on an OpenAI-compatible endpoint",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--config", default="default",
                       help="a bundled config name (default, tiny, 8xgpu) or a TOML file (default: %(default)s)")
    serve.add_argument("--host", help="interface to bind (server.host)")
    serve.add_argument("--port", type=int, help="TCP port (server.port)")
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 (server.api_key)")
    serve.add_argument("--data-dir", help="folder for durable state (data_dir)")
    return parser


def dotted_overrides(rest: list[str]) -> dict[str, Any]:
    """``--a.b=1`` / ``--a.b 1`` pairs from the arguments argparse did not know."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        flag = rest[i]
        if not flag.startswith("--") or "." not in flag.split("=", 1)[0]:
            raise ConfigError(f"unrecognized argument: {flag}")
        key, eq, value = flag[2:].partition("=")
        if not eq:
            if i + 1 >= len(rest):
                raise ConfigError(f"{flag}: expected a value")
            i += 1
            value = rest[i]
        overrides[key.replace("-", "_")] = parse_override_value(value)
        i += 1
    return overrides


def parse_config(argv: list[str]) -> tuple[str, MIAConfig]:
    args, rest = _parser().parse_known_args(argv)
    overrides = dotted_overrides(rest)
    for flag, key in (("host", "server.host"), ("port", "server.port"), ("api_key", "server.api_key"),
                      ("data_dir", "data_dir")):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    return args.command, load_config(args.config, overrides)


def main(argv: list[str] | None = None) -> int:
    try:
        command, config = parse_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if command == "serve":
        from .serve import serve

        serve(config)
    return 0
