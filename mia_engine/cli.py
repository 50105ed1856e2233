"""Command line: ``python -m mia_engine serve [MODEL] [--config NAME|PATH] [--host] [--port] [--api-key]
[--data-dir] [--<vLLM engine flag> ...] [--dotted.field=VALUE ...]``, in the style of ``vllm serve``.

MODEL (a local folder or a Hugging Face id) is served in every role by one engine, as ``vllm serve MODEL``
serves it; with ``--config`` it replaces the model of that config's Planner engine. vLLM's engine flags
(``--tensor-parallel-size 2``, ``--max-model-len 16k``, ...) set their field on every engine.

Any config field can be overridden with its dotted path, e.g. ``--engines.smollm2.max_model_len=8192``
or ``--roles.planner.sampling.temperature 0.7``; values are read as TOML (``8``, ``true``, ``[0, 1]``)
or else as strings. A bad flag or config exits with one line that names the field; ``config show``
prints the effective config with each field's documentation.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from . import __version__
from .base import logs
from .base.config_docs import plain, render_markdown, render_toml
from .config import (ConfigError, LearnerConfig, MIAConfig, check_adapter_dirs, check_bind, check_keys,
                     load_config, parse_override_value, planner_engine)
from .config.flags import EVERY_ENGINE, add_engine_flags, engine_flag_overrides
from .config.served_model import ModelFacts
from .config.vllm_args import ENGINE_ARGS
from .devices import resolved_devices
from .preflight import (ADMIN_API_KEY_ENV, API_KEY_ENV, PROG, bound_onednn_caches, dry_run, preflight,
                        with_admin_key)

KEY_FLAGS = {"server.api_key": (API_KEY_ENV, "--api-key-file"),
             "server.admin_api_key": (ADMIN_API_KEY_ENV, "--admin-api-key-file")}
"""Key fields that show in ``ps`` when given on the command line, with where to give them instead."""
CONFIG_REFERENCE_INTRO = (
    "Every field of a config file (`configs/*.toml`, or your own passed with `--config`), table by table, with "
    "its type, default and what it does. Any field can also be set on the command line by its dotted path, "
    "e.g. `--server.port=8001` or `--engines.<name>.max_model_len=8192`. `python -m mia_engine config show "
    "[--config X]` prints the effective values. Generated from the config structs by `python -m mia_engine "
    "config show --markdown > docs/CONFIG.md`: edit the docstrings, not this file.")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="MIA Engine: the Memory Intelligence Agent on vLLM.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = _Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    serve = sub.add_parser("serve", help="serve the roles (and the agent) on an OpenAI-compatible endpoint",
                           description="\n\n".join(textwrap.fill(plain(part), 100, break_on_hyphens=False) for part in __doc__.split("\n\n")),
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           usage="%(prog)s [MODEL] [--config NAME|PATH] [options] [--<vLLM engine flag> ...] "
                                 "[--dotted.field=VALUE ...]")
    serve.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    serve.add_argument("--model", help="MODEL, as a word of its own or with this flag: serve this model (a local "
                       "folder or a Hugging Face id) in every role, as `vllm serve MODEL`; with --config, it replaces "
                       "the model of that config's Planner engine")
    serve.add_argument("--config", default=None,
                       help="a bundled config name (default, tiny, 8xgpu) or a TOML file (default: default, or "
                            "with MODEL the one-model config)")
    serve.add_argument("--host", help="interface to bind (server.host)")
    serve.add_argument("--port", type=int, help="TCP port (server.port)")
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 (server.api_key); shows in "
                                         f"ps: prefer ${API_KEY_ENV} or --api-key-file")
    serve.add_argument("--api-key-file", help="file holding the API key (server.api_key_file)")
    serve.add_argument("--admin-api-key-file",
                       help=f"file holding the admin key (server.admin_api_key_file; or ${ADMIN_API_KEY_ENV})")
    serve.add_argument("--data-dir", help="folder for durable state (data_dir)")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                       help="log level of the server and of vLLM's processes (server.log_level)")
    serve.add_argument("--log-format", choices=("text", "json"),
                       help="text lines, or one JSON object per line (server.log_format)")
    serve.add_argument("--dry-run", action="store_true",
                       help="print the placement and each GPU's memory budget from the models' config.json "
                            "files, refuse an impossible config, and exit (no GPU, no weights needed)")
    serve.add_argument("--lora-modules", nargs="+", metavar="NAME=PATH",
                       help="extra LoRA adapters served by name on the base model's engine, as vllm serve's "
                            "(name=path, or its JSON form with base_model_name)")
    add_engine_flags(serve, {flag for action in serve._actions for flag in action.option_strings})
    for name, help_text in (("run", "answer a dataset (evaluation), resumable, with accuracy at the end"),
                            ("ttl", "test-time learning over a dataset: GRPO updates of the Planner as it goes")):
        cmd = sub.add_parser(name, help=help_text)
        _common(cmd)
        cmd.add_argument("--dataset", required=True, help="a .jsonl/.parquet file, or fanoutqa-dev")
        cmd.add_argument("--out", type=Path, required=True, help="results JSONL (appended; resumable)")
        cmd.add_argument("--concurrency", type=int, default=16, help="questions in flight (default %(default)s)")
        cmd.add_argument("--rollouts", type=int, default=None, help="G per question (default: agent config)")
        cmd.add_argument("--limit", type=int, default=None, help="only the first N questions")
        if name == "ttl":
            cmd.add_argument("--epochs", type=int, default=1)
            cmd.add_argument("--metrics-out", type=Path, default=Path("ttl_metrics.jsonl"))
            cmd.add_argument("--plot", type=Path, default=Path("ttl_curves.png"))
    init = sub.add_parser("init-adapter", help="write a zero-initialised LoRA adapter (B = 0) for a base model: "
                          "the Planner's starting point for test-time learning")
    init.add_argument("--base", type=Path, required=True, help="the base model's local folder (config.json)")
    init.add_argument("--rank", type=int, required=True, help="LoRA rank r (<= the engine's max_lora_rank)")
    init.add_argument("--out", type=Path, required=True, help="the adapter folder to create (must not exist)")
    init.add_argument("--alpha", type=int, default=None, help="lora_alpha (default: 2 x rank)")
    init.add_argument("--targets", default=None, help="comma-separated decoder projections to adapt "
                      "(default: all seven, q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)")
    init.add_argument("--seed", type=int, default=0, help="seed of the A matrices (default %(default)s)")
    doctor = sub.add_parser("doctor", help="check the GPU stack (memory kernel, a GRPO step, faiss-gpu; on request "
                            "searches under the learner); no vLLM")
    doctor.add_argument("--small", action="store_true", help="CPU sizes (automatic without a GPU)")
    doctor.add_argument("--layers", type=int, default=4, help="depth of the Qwen3-8B-shaped stack (default %(default)s)")
    doctor.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default %(default)s)")
    doctor.add_argument("--checks", type=_doctor_checks, default=None, metavar="LIST",
                        help="comma-separated checks among kernel,grpo,faiss,contention (default: "
                             "kernel,grpo,faiss)")
    doctor.add_argument("--config", default=None, help="a config (name or TOML file) whose [learner] section "
                        "sets the GRPO step's recompute and its model-FLOPs utilisation floor "
                        "(learner.min_model_flops_utilization); default: the learner's defaults")
    _eval_parser(sub)
    index = sub.add_parser("index", help="build (or reuse) the passage index of a corpus, with a progress bar")
    _common(index)
    index.add_argument("--corpus", default=None, help="wiki-offline or a .jsonl/.parquet file (default: tools.corpus)")
    index.add_argument("--images", type=Path, default=None, metavar="DIR",
                       help="index the images under DIR for image-to-image search instead (tools.image_index)")
    _config_parser(sub)
    _keys_parser(sub)
    return parser


class _Commands:
    """argparse's subcommands, each described on its own ``--help`` by the line the command list shows."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    def add_parser(self, name: str, *, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("description", help[:1].upper() + help[1:] + ".")
        return self._sub.add_parser(name, help=help, **kwargs)


def _config_parser(sub: _Commands) -> None:
    config = sub.add_parser("config", help="show the effective config: every field with its value, documentation "
                            "and default")
    show = _Commands(config.add_subparsers(dest="config_command", required=True, metavar="ACTION")).add_parser(
        "show", help="print the config after its file and the dotted overrides (--section.field=VALUE), as TOML "
        "that loads back, each field preceded by what it does and, where the value differs, its default "
        "(API keys masked)")
    show.add_argument("--config", default="default", help="bundled config name or TOML file (default: %(default)s)")
    show.add_argument("--markdown", action="store_true",
                      help="print instead the reference of every field (type, default, what it does) as Markdown: "
                           "docs/CONFIG.md")


def _keys_parser(sub: _Commands) -> None:
    keys = sub.add_parser("keys", help="make, list and remove keys of several users for server.keys_file")
    actions = _Commands(keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION"))
    add = actions.add_parser(
        "add", help="generate a random key named NAME with its scopes, append its hash to the keys file (created "
        "mode 0600 where missing) and print the key, once; send SIGHUP to a running server to load it")
    add.add_argument("name", metavar="NAME", help="the key's name, shown in the access log and the audit lines")
    add.add_argument("--scopes", required=True, type=_key_scopes, metavar="LIST",
                     help="comma-separated scopes among chat,agent,learn,memory-read,memory-write,admin")
    add.add_argument("--file", required=True, type=Path, help="the keys file (server.keys_file)")
    add.add_argument("--max-concurrent", type=int, default=0, metavar="N",
                     help="this key's per-client bound (default 0: server.admission.max_concurrent_per_client)")
    listing = actions.add_parser("list", help="print each key of the keys file: its name, scopes and "
                                 "max_concurrent (never its hash)")
    listing.add_argument("--file", required=True, type=Path, help="the keys file (server.keys_file)")
    remove = actions.add_parser("remove", help="remove the key named NAME from the keys file; send SIGHUP to a "
                                "running server to stop accepting it")
    remove.add_argument("name", metavar="NAME", help="the key's name")
    remove.add_argument("--file", required=True, type=Path, help="the keys file (server.keys_file)")


def _key_scopes(text: str) -> list[str]:
    """``--scopes chat,agent``: a one-line argparse error names an unknown scope."""
    from .base.key_table import SCOPES

    scopes = [scope.strip() for scope in text.split(",") if scope.strip()]
    unknown = [scope for scope in scopes if scope not in SCOPES]
    if unknown or not scopes:
        raise argparse.ArgumentTypeError(f"unknown scope(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {','.join(SCOPES)}")
    return scopes


def _keys(args: argparse.Namespace) -> int:
    """``keys add|list|remove``: 0, or one line naming the problem (exit 2), the file unchanged."""
    from .base.keys import KeyFileError

    action = {"add": _add_key, "list": _list_keys, "remove": _remove_key}[args.keys_command]
    try:
        action(args)
    except KeyFileError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    return 0


def _add_key(args: argparse.Namespace) -> None:
    """``keys add``: the new key alone on stdout (for ``KEY=$(...)``), what was done on stderr."""
    from .base.key_table import add_key

    key = add_key(args.file, args.name, args.scopes, args.max_concurrent)
    print(key)
    print(f"added key {args.name!r} ({','.join(args.scopes)}) to {args.file}: this is the only time the key is shown; "
          "send SIGHUP to a running server to load it", file=sys.stderr)


def _list_keys(args: argparse.Namespace) -> None:
    """``keys list``: one line per key, ``NAME scopes=A,B max_concurrent=N``, in the file's order."""
    from .base.key_table import SCOPES, list_keys

    for entry in list_keys(args.file):
        scopes = ",".join(scope for scope in SCOPES if scope in entry.scopes)
        print(f"{entry.name} scopes={scopes} max_concurrent={entry.max_concurrent}")


def _remove_key(args: argparse.Namespace) -> None:
    """``keys remove``: what was done on stderr."""
    from .base.key_table import remove_key

    remove_key(args.file, args.name)
    print(f"removed key {args.name!r} from {args.file}; send SIGHUP to a running server to stop accepting it",
          file=sys.stderr)


def _doctor_checks(text: str) -> tuple[str, ...]:
    """``--checks kernel,grpo``: a one-line argparse error names an unknown check."""
    from .doctor import CHECKS

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in CHECKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown check(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {','.join(CHECKS)}")
    return names


def _eval_parser(sub: Any) -> None:
    from .evals.results import METRICS, MODES

    cmd = sub.add_parser("eval", help="answer quality: bare model, ReAct, MIA G=1/G=4, and test-time learning "
                         "(supervised, unsupervised) on the same questions; a table, JSON and a PNG")
    _common(cmd)
    cmd.add_argument("--dataset", required=True, help="a .jsonl/.parquet file with answers, or fanoutqa-dev")
    cmd.add_argument("--split", default="all",
                     help="only the rows whose 'split' field says so, e.g. dev, heldout (bench/devset_wiki.jsonl), "
                          "popular, longtail (bench/devset_popularity.jsonl) or yesno-dev, comparison-heldout, "
                          "numeric-dev (bench/devset_types.jsonl); all = every row (default: %(default)s)")
    cmd.add_argument("--limit", type=int, default=None, help="only the first N questions (of the split)")
    cmd.add_argument("--epochs", type=int, default=3, help="test-time-learning epochs (default %(default)s)")
    cmd.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), metavar="MODE",
                     help=f"any of {', '.join(MODES)} (default: all)")
    cmd.add_argument("--concurrency", type=int, default=8, help="questions in flight (default %(default)s)")
    cmd.add_argument("--metric", choices=METRICS, default="match",
                     help="the headline metric of the table, pairing and plot: match (normalised exact or contains), "
                          "exact, or judge (the paper's LLM judge prompt grades every answer; match and exact are "
                          "recorded beside it) (default %(default)s)")
    cmd.add_argument("--judge-role", default="manager",
                     help="who grades with --metric judge: a loop role (manager, judge, planner, ...) or a role id "
                          "of the config (default %(default)s, the paper's judge LLM)")
    cmd.add_argument("--ttl-eval-split", default=None, metavar="SPLIT",
                     help="a split test-time learning never learns from: measured after each epoch, and by the "
                          "baselines, beside the learned --split (default: none)")
    cmd.add_argument("--seeds", type=int, default=1,
                     help="runs of everything, run i with i added to every seed; rates as median (min-max) "
                          "(default %(default)s)")
    cmd.add_argument("--out", type=Path, default=Path("eval_results.json"), help="results JSON (default %(default)s)")
    cmd.add_argument("--plot", type=Path, default=Path("eval_accuracy.png"),
                     help="accuracy-by-epoch PNG (default %(default)s)")


def _common(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--config", default="default", help="bundled config name or TOML file")
    cmd.add_argument("--data-dir", help="folder for durable state (data_dir)")


SERVED_NAMES = f"{EVERY_ENGINE}.served_model_name"
"""``--served-model-name``'s override: with MODEL, it names MODEL's engine only."""


def _model_arg(args: argparse.Namespace) -> str | None:
    """MODEL, given as the positional argument or as ``--model`` (not two different ones)."""
    if args.model_tag and args.model and args.model_tag != args.model:
        raise ConfigError(f"--model: {args.model!r} differs from MODEL {args.model_tag!r}; give one")
    return args.model_tag or args.model


def model_facts(model: str, args: argparse.Namespace, overrides: Mapping[str, Any]) -> ModelFacts:
    """What the config takes from MODEL's ``config.json`` (fetched alone from the Hub for an id that is not
    in the Hugging Face cache, unless ``HF_HUB_OFFLINE=1``); whether its engine runs on a GPU: this
    machine has one, or a dry run plans ``--gpus.num_gpus``."""
    from .deploy.shapes import decoder_shape, read_config
    from .devices import machine_has_gpu
    from .models.cache import default_home
    from .models.embedded import model_dir

    home = Path(str(overrides.get("models.home") or default_home())).expanduser()
    try:
        raw = read_config(model_dir(model, home, download="config"))
        shape = decoder_shape(raw)
    except (FileNotFoundError, KeyError, ValueError, OSError) as err:
        raise ConfigError(f"MODEL: {str(err).strip(chr(34))}") from None
    text = raw.get("text_config", raw)
    on_gpu = bool(overrides.get("gpus.num_gpus")) if args.dry_run else machine_has_gpu()
    return ModelFacts(model, shape.num_params, int(text.get("max_position_embeddings") or 0), on_gpu)


def with_gpu_share(config: MIAConfig, overrides: Mapping[str, Any], *, is_dry_run: bool) -> MIAConfig:
    """MODEL's engine on a GPU with ``gpu_memory_utilization`` = vLLM's default less what the serving
    process keeps on that GPU (``deploy/budget.py: engine_share``), unless the command line set it."""
    from .deploy.budget import GIB, engine_share
    from .models.cache import default_home
    from .models.embedded import model_dir

    if any(key.endswith(".gpu_memory_utilization") for key in overrides):
        return config
    name = planner_engine(config)
    engine = config.engines[name]
    if is_dry_run:
        capacity = int(config.gpus.memory_gib * GIB)
    else:  # the budget and the start-up plan count this machine's GPUs
        import torch

        capacity = torch.cuda.mem_get_info((engine.devices or [0])[0])[1]
        gpus = msgspec.structs.replace(config.gpus, memory_gib=capacity / GIB, num_gpus=torch.cuda.device_count())
        config = msgspec.structs.replace(config, gpus=gpus)
    home = Path(config.models.home).expanduser() if config.models.home else default_home()
    share = engine_share(config, name, lambda spec: model_dir(spec, home, download="config"), capacity,
                         ENGINE_ARGS["gpu_memory_utilization"]["default"])
    if share <= 0:
        raise ConfigError(f"engines.{name}.gpu_memory_utilization: the serving process alone takes this GPU; move "
                          "the learner or the encoders (learner.device, memory.embedder.device) to another one")
    logging.getLogger(PROG).info("engines.%s.gpu_memory_utilization = %.2f: vLLM's default less the serving "
                                 "process's own share of the GPU", name, share)
    engines = {**config.engines, name: msgspec.structs.replace(engine, gpu_memory_utilization=share)}
    return msgspec.structs.replace(config, engines=engines)


def dotted_overrides(rest: list[str]) -> dict[str, Any]:
    """``--a.b=1`` / ``--a.b 1`` pairs from the arguments argparse did not know; a root field of the
    config (``--cpu.onednn_cache_capacity=64``) needs no dot."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        flag = rest[i]
        key, eq, value = flag[2:].partition("=")
        if not flag.startswith("--") or ("." not in key and key.replace("-", "_") not in MIAConfig.__struct_fields__):
            raise ConfigError(f"unrecognized argument: {flag}{_closest_flag(flag)}")
        if not eq:
            if i + 1 >= len(rest):
                raise ConfigError(f"{flag}: expected a value")
            i += 1
            value = rest[i]
        table, _, field = key.rpartition(".")  # table names (engines.qwen3-8b) may hold dashes; fields do not
        field = field.replace("-", "_")
        overrides[f"{table}.{field}" if table else field] = parse_override_value(value)
        i += 1
    return overrides


def _model_position(argv: list[str]) -> int | None:
    """Where ``serve``'s MODEL is in ``argv``: the first word that is neither a flag nor a flag's value (a
    flag without ``=`` that takes a value takes the next word, as ``--engines.x.max_model_len 8192`` does;
    one of several values takes the words up to the next flag)."""
    if argv[:1] != ["serve"]:
        return None
    takes = {option: action.nargs for action in _serve_parser()._actions for option in action.option_strings}
    i = 1
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            return i
        nargs = takes.get(word, 1)  # an unknown flag: a dotted override and its value
        if nargs == 0 or "=" in word:
            i += 1
        elif nargs == "+":
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1
        else:
            i += 2
    return None


def _closest_flag(flag: str) -> str:
    """`` (did you mean --x?)`` with the closest flag of ``serve`` (vLLM's engine flags included), if any."""
    name = flag.partition("=")[0]
    known = [option for action in _serve_parser()._actions for option in action.option_strings]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _serve_parser() -> argparse.ArgumentParser:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The command's arguments and the config overrides the user gave: flags, then dotted overrides; keys
    may also come from ``$MIA_API_KEY`` / ``$MIA_ADMIN_API_KEY`` (a flag or override wins over the environment)."""
    environ = os.environ if environ is None else environ
    at = _model_position(argv)
    args, rest = _parser().parse_known_args(argv if at is None else argv[:at] + argv[at + 1:])
    args.model_tag = None if at is None else argv[at]
    overrides: dict[str, Any] = {}
    if args.command == "serve":
        for name, key, file_flag in ((API_KEY_ENV, "server.api_key", "api_key_file"),
                                     (ADMIN_API_KEY_ENV, "server.admin_api_key", "admin_api_key_file")):
            if environ.get(name) and not getattr(args, file_flag):  # an explicit key file wins
                overrides[key] = environ[name]
    dotted = dotted_overrides(rest)
    args.keys_on_command_line = [f"--{key}" for key in KEY_FLAGS if key in dotted]
    overrides.update(engine_flag_overrides(args))
    overrides.update(dotted)
    if args.command == "serve":
        args.model = _model_arg(args)
        args.served_names = overrides.pop(SERVED_NAMES, None) if args.model else None
    for flag, key in (("host", "server.host"), ("port", "server.port"), ("api_key", "server.api_key"),
                      ("api_key_file", "server.api_key_file"), ("admin_api_key_file", "server.admin_api_key_file"),
                      ("data_dir", "data_dir"), ("corpus", "tools.corpus"), ("log_level", "server.log_level"),
                      ("log_format", "server.log_format")):
        if getattr(args, flag, None) is not None:
            overrides[key] = getattr(args, flag)
    return args, overrides


def parse_config(argv: list[str], environ: Mapping[str, str] | None = None) -> tuple[argparse.Namespace, MIAConfig]:
    """The command's arguments and its config (``serve`` refuses an unsafe bind here)."""
    args, overrides = parse_args(argv, environ)
    return args, _load(args, overrides)


def _load(args: argparse.Namespace, overrides: dict[str, Any]) -> MIAConfig:
    """The config; for a command that starts the services, with every component device explicit
    (``devices.resolved_devices``: ``cuda``/``auto`` become the GPU the budget counts)."""
    model = getattr(args, "model", None)
    facts = model_facts(model, args, overrides) if model else None
    served_names = getattr(args, "served_names", None)
    config = load_config(args.config, overrides, model=facts, served_names=served_names)
    if getattr(args, "lora_modules", None):
        from .config.lora_modules import default_lora_engine, lora_module_overrides

        engines = {name: engine.model_ids(name) for name, engine in config.engines.items()}
        overrides = {**overrides, **lora_module_overrides(args.lora_modules, engines, default_lora_engine(config))}
        config = load_config(args.config, overrides, model=facts, served_names=served_names)
    if facts is not None and facts.on_gpu:
        config = with_gpu_share(config, overrides, is_dry_run=args.dry_run)
    if getattr(args, "dry_run", False):
        return config
    if args.command == "serve":
        check_bind(config.server)
        check_adapter_dirs(config.server)
        args.key_warnings = check_keys(config.server)
    return resolved_devices(config) if args.command in ("serve", "run", "ttl", "eval") else config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # first: a SIGHUP (keys reload) must not end a server still starting
        from .server.key_ring import DeferredSighup

        DeferredSighup.install()
    if argv[:1] == ["doctor"]:  # needs no config
        from . import doctor

        args = _parser().parse_args(argv)
        try:
            learner = load_config(args.config).learner if args.config else LearnerConfig()
        except ConfigError as err:
            print(f"{PROG} doctor: {err}", file=sys.stderr)
            return 2
        return doctor.main(args.small, args.layers, args.seq_len, args.checks or doctor.DEFAULT_CHECKS, learner)
    if argv[:1] == ["init-adapter"]:  # needs no config
        return _init_adapter(_parser().parse_args(argv))
    if argv[:1] == ["keys"]:  # needs no config
        return _keys(_parser().parse_args(argv))
    try:
        args, overrides = parse_args(argv)
        config = _load(args, overrides)
        _check_args(args)
    except ConfigError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(render_markdown(MIAConfig, "Configuration reference", CONFIG_REFERENCE_INTRO) if args.markdown
              else render_toml(config), end="")
        return 0
    if getattr(args, "dry_run", False):
        return dry_run(config)
    logs.configure(config.server.log_level, config.server.log_format)  # before vLLM is imported
    if args.command == "serve":
        if preflight(config) != 0:
            return 2
        config = with_admin_key(config)  # after the data dir's check, and only for a server that starts
        if config is None:
            return 2
    bound_onednn_caches(config)  # before the encoder's or learner's first matmul
    if args.command == "serve":
        _warn_about_exposure(args, config)
        from .serve import serve

        return serve(config, PROG)
    elif args.command == "eval":
        from .evals.evaluate import EvalOptions, main as evaluate

        evaluate(config, args.config, overrides, EvalOptions(
            args.dataset, args.out, args.plot, args.split, args.limit, args.epochs, tuple(args.modes), args.concurrency,
            args.metric, args.judge_role, args.ttl_eval_split, args.seeds))
    elif args.command == "index" and args.images is not None:
        from .index import build_images

        print(build_images(config, args.images))
    elif args.command == "index":
        from .index import build

        print(build(config))
    else:
        from .evals import batch

        rollouts = args.rollouts or (config.agent.num_rollouts if args.command == "ttl"
                                     else config.agent.num_rollouts_low_latency)
        common = dict(concurrency=args.concurrency, rollouts=rollouts, limit=args.limit)
        if args.command == "run":
            batch.run(config, args.dataset, args.out, **common)
        else:
            batch.ttl(config, args.dataset, args.out, epochs=args.epochs, metrics_out=args.metrics_out,
                      plot=args.plot, **common)
    return 0


def _init_adapter(args: argparse.Namespace) -> int:
    """``init-adapter``: the folder on stdout, or one line naming the flag (exit 2)."""
    from .models.lora import DECODER_LORA_TARGETS, init_adapter

    targets = (DECODER_LORA_TARGETS if args.targets is None
               else tuple(name.strip() for name in args.targets.split(",") if name.strip()))
    if not (args.base / "config.json").is_file():
        print(f"{PROG}: error: --base: {args.base} is not a local model folder (no config.json)", file=sys.stderr)
        return 2
    try:
        path = init_adapter(args.base, args.out, rank=args.rank, alpha=args.alpha, target_modules=targets,
                            seed=args.seed)
    except (ValueError, FileExistsError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _warn_about_exposure(args: argparse.Namespace, config: MIAConfig) -> None:
    log = logging.getLogger(PROG)
    if getattr(args, "api_key", None):
        log.warning("--api-key is visible to every user of this machine (ps); use $%s or --api-key-file", API_KEY_ENV)
    for flag in getattr(args, "keys_on_command_line", ()):
        env, file_flag = KEY_FLAGS[flag[2:]]
        log.warning("%s is visible to every user of this machine (ps); use $%s or %s", flag, env, file_flag)
    for line in getattr(args, "key_warnings", ()):
        log.warning("%s", line)
    server = config.server
    if server.allow_unauthenticated_bind and not server.api_key and not server.is_loopback():
        log.warning("SERVING %s WITHOUT AN API KEY (server.allow_unauthenticated_bind): anyone who can reach "
                    "port %d can use this server", server.host, server.port)
    if not server.is_loopback() and not server.allowed_hosts:
        log.warning("bound to %s, but only Host headers naming localhost or %s are accepted: list the names "
                    "clients use in server.allowed_hosts", server.host, server.host)


def _check_args(args: argparse.Namespace) -> None:
    for name in ("concurrency", "rollouts", "limit", "epochs"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{name}: must be >= 1, got {value}")
    dataset = getattr(args, "dataset", None)
    if dataset and not dataset.endswith((".jsonl", ".json", ".parquet")) and dataset != "fanoutqa-dev":
        raise ConfigError(f"--dataset: expected a .jsonl/.json/.parquet file or fanoutqa-dev, got {dataset!r}")
    if dataset and dataset != "fanoutqa-dev" and not Path(dataset).is_file():
        raise ConfigError(f"--dataset: no such file: {dataset}")
