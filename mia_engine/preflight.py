"""What ``serve`` checks and prepares before anything starts: the packages, the adapters, the per-GPU
budget against this box's GPUs where NVML answers (also ``serve --dry-run``'s report), a Ray cluster to
join, a data dir of this user's alone, the admin key, and this process's oneDNN bound. Each refusal is
one line on stderr after ``PROG``."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from .base.files import UnsafeFolder, private_dir
from .base.keys import ADMIN_KEY_FILE, KeyFileError, admin_key
from .base.onednn import bound_this_process
from .base.packages import missing_for_serving
from .config import ConfigError, MIAConfig, check_keys
from .devices import resolve_device, serving_device_fields

PROG = "python -m mia_engine"
"""The command's name in its error lines."""
API_KEY_ENV = "MIA_API_KEY"
ADMIN_API_KEY_ENV = "MIA_ADMIN_API_KEY"


CPU_COMPUTE_FIELDS = ("memory.embedder.device", "tools.embedder.device", "learner.device")
"""The devices of this process's components that run matmuls (the encoders, the learner)."""


def bound_onednn_caches(config: MIAConfig) -> None:
    """Bound this process's oneDNN primitive caches (``cpu.onednn_cache_capacity``) where one of its
    encoders or its learner runs on the CPU (a host fact, whatever platform the engines run on); nothing
    to bound where they all run on GPUs."""
    devices = serving_device_fields(config)
    if all(resolve_device(devices[field]) != "cpu" for field in CPU_COMPUTE_FIELDS):
        return
    bound_this_process(config.cpu.onednn_cache_capacity)


def dry_run(config: MIAConfig) -> int:
    """``serve --dry-run``: the report on stdout (exit 0), or one line naming the field (exit 2), after the
    per-GPU table when a GPU is over-committed."""
    from .deploy.report import render

    checked = deployment_check(config, os.environ, is_dry_run=True)
    if checked is None:
        return 2
    result, adapter_lines, fit = checked
    print(render(config, result, adapter_lines, fit=fit))
    return 0


def preflight(config: MIAConfig, environ: Mapping[str, str] | None = None) -> int:
    """What ``serve`` checks before it starts anything: vLLM and the embedded default's packages (a missing
    one is named with the command that installs it), the adapters that are not embedded ones, where the
    config or this machine has GPUs the per-GPU budget (the dry run's), that a Ray engine has a
    cluster to join, and that the data dir is this user's alone (``base.files.private_dir``). 0 = start."""
    environ = os.environ if environ is None else environ
    missing = missing_for_serving(config)  # the embedded default's model, encoder and corpus packages
    if missing is not None:
        print(f"{PROG}: error: {missing}", file=sys.stderr)
        return 2
    ray = [name for name, engine in config.engines.items() if engine.executor_backend == "ray"]
    if ray and not environ.get("RAY_ADDRESS"):  # Ray would start a private instance on this box's GPUs
        print(f"{PROG}: error: engines.{ray[0]}.executor_backend: 'ray' needs the cluster's address: export "
              "RAY_ADDRESS=<head node>:6379 (docs/DEPLOY_8GPU.md, 'Past one box')", file=sys.stderr)
        return 2
    checked = deployment_check(config, environ, is_dry_run=False)
    if checked is None:
        return 2
    result, adapter_lines, fit = checked
    if result is not None:  # a config with GPUs: where each role, the memory, the encoder and the learner run
        from .deploy.report import render

        logging.getLogger(PROG).info("%s", render(config, result, adapter_lines, "MIA Engine start-up plan", fit))
    try:  # last: it creates the data dir, which a refused config must not leave behind
        private_dir(config.resolved_data_dir(), "data_dir")
    except UnsafeFolder as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    return 0


def deployment_check(config: MIAConfig, environ: Mapping[str, str], *,
                     is_dry_run: bool) -> tuple[Any, list[str], Any] | None:
    """The adapters' check, the GPU plan (None where ``serve`` plans no GPU) and, where the config places
    something on a GPU and NVML answers, this box's fit for it (``deploy/box.py``; else None); on a refusal
    it prints the per-GPU table and the error to stderr and returns None."""
    from .deploy.adapters import check_role_adapters
    from .deploy.box import BoxMisfit
    from .deploy.budget import OverCommitted, plan, plans_gpus
    from .deploy.engines import check_engine_parsers, check_engines
    from .deploy.report import render_box, render_memory
    from .models.cache import default_home
    from .models.embedded import adapter_dir, model_dir

    home = Path(config.models.home).expanduser() if config.models.home else default_home()
    models = lambda spec: model_dir(spec, home)  # noqa: E731
    try:
        check_engines(config, models)
        adapter_lines = check_role_adapters(config, models, lambda spec, base: adapter_dir(spec, base, home),
                                            include_embedded=is_dry_run)
        result, fit = None, None
        if plans_gpus(config):
            result, fit = _plan_on_box(config, models, environ, is_dry_run)
        elif is_dry_run:
            result = plan(config, models)
        check_engine_parsers(config)  # last: it imports vLLM
    except BoxMisfit as err:
        print(render_box(err.fit), file=sys.stderr)
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return None
    except OverCommitted as err:
        print(render_memory(err.plan), file=sys.stderr)
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return None
    except (ConfigError, FileNotFoundError, KeyError, ValueError) as err:
        print(f"{PROG}: error: {str(err).strip(chr(34) + chr(39))}", file=sys.stderr)
        return None
    return result, adapter_lines, fit


def _plan_on_box(config: MIAConfig, models: Callable[[str], Path], environ: Mapping[str, str],
                 is_dry_run: bool) -> tuple[Any, Any]:
    """The plan of a config with GPUs and this box's fit for it (``deploy/box.py``); where NVML does not
    answer, the plan on the config's ``[gpus]`` figures, with a note saying so (and, for ``serve``, a
    warning)."""
    from .deploy import gpu_probe
    from .deploy.box import check_box, on_box
    from .deploy.budget import plan
    from .deploy import cuda_driver
    from .deploy.cuda_driver import SKIP_DRIVER_CHECK_ENV

    box = gpu_probe.probe_box(environ)
    config = on_box(config, box)
    result = plan(config, models)
    if box is None:
        note = (f"NVML did not answer (no NVIDIA driver, or no nvidia-ml-py): planned on gpus.memory_gib = "
                f"{config.gpus.memory_gib:g} GiB, not this box's GPUs")
        result.notes.append(note)
        if not is_dry_run:
            logging.getLogger(PROG).warning("%s", note)
        return result, None
    is_driver_checked = environ.get(SKIP_DRIVER_CHECK_ENV) != "1"
    return result, check_box(config, result, box, cuda_driver.torch_cuda(), is_driver_checked=is_driver_checked)


def with_admin_key(config: MIAConfig) -> MIAConfig | None:
    """The config with its admin key: where none is configured, the one generated at first start in the
    data dir (``base.keys.admin_key``), and one log line that says where it is. None (after one line on
    stderr) where that file cannot be used."""
    server = config.server
    if server.admin_api_key:
        return config
    path = config.resolved_data_dir() / ADMIN_KEY_FILE
    try:
        key, created = admin_key(path)
        server = msgspec.structs.replace(server, admin_api_key=key)
        check_keys(server)
    except (KeyFileError, ConfigError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return None
    except OSError as err:
        print(f"{PROG}: error: data_dir: cannot create {path}: {err.strerror}", file=sys.stderr)
        return None
    logging.getLogger(PROG).log(
        logging.WARNING if created else logging.INFO,
        "admin key %s %s: send it as 'Authorization: Bearer <key>' to publish adapters, learn and write memory "
        "(or set $%s)", "generated in" if created else "read from", path, ADMIN_API_KEY_ENV)
    return msgspec.structs.replace(config, server=server)
