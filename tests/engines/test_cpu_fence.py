"""The CPU package is fenced: a GPU start imports none of it (``mia_engine/engines/cpu/__init__.py``).

A fresh process is made a GPU box as vLLM itself decides it: its CPU detection says no (a CUDA build)
and its CUDA detection picks a stand-in CUDA platform (this machine has no GPU and its vLLM no CUDA
kernels), so vLLM asks our ``vllm.platform_plugins`` entry point as on a real GPU build. Then it does
what ``serve --config 8xgpu`` does up to the engines' start: the command line's config and process
set-up, the services (role server, memory, agent, learner) and the engine start itself, each engine's
vLLM engine args built and its spawn environment applied, stopped where vLLM would spawn on the GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "deploy" / "fixtures"

GPU_START = r'''
import asyncio, json, os, sys
from pathlib import Path

import vllm.platforms as platforms
from vllm.platforms.interface import Platform, PlatformEnum


class FakeCudaPlatform(Platform):
    """vLLM's view of a CUDA GPU, for what runs before an engine spawns."""
    _enum = PlatformEnum.CUDA
    device_name = device_type = "cuda"
    dispatch_key, ray_device_key, dist_backend = "CUDA", "GPU", "nccl"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"


platforms.cpu_platform_plugin = lambda: None  # a CUDA build: vLLM's CPU detection (ours asks it too)
platforms.builtin_platform_plugins.update(cpu=platforms.cpu_platform_plugin,
                                          cuda=lambda: "__main__.FakeCudaPlatform")
assert isinstance(platforms.current_platform, FakeCudaPlatform)
asked = "mia_engine.engines.platforms" in sys.modules  # vLLM loaded our entry point, which stood aside

from mia_engine import cli
from mia_engine.preflight import bound_onednn_caches
from mia_engine.engines.vllm_engine import VLLMEngine
from mia_engine.services import Services

fixtures, data_dir = Path(sys.argv[1]), sys.argv[2]
args, config = cli.parse_config(
    ["serve", "--config", sys.argv[3], "--data-dir", data_dir,
     *(f"--engines.{name}.model={fixtures / name}" for name in ("qwen3-8b", "qwen2_5-vl-7b", "qwen3-32b")),
     "--engines.qwen3-32b.cpu.kv_cache_space_gib=4"],  # a CPU-only setting that must not split a GPU group
    {"MIA_API_KEY": "api-key-of-16-chars", "MIA_ADMIN_API_KEY": "admin-key-of-16-chars"})
bound_onednn_caches(config)
services = Services(config)
started = {}


async def reached_spawn(self, config_lock=None):
    """Where vLLM would spawn the engine: what it would be built from, and the environment it would inherit."""
    engine_args = self._engine_args()
    started[self.name] = {"dtype": engine_args.dtype, "additional_config": engine_args.additional_config,
                          "device_ids": engine_args.device_ids,
                          "cpu_env": sorted(k for k in os.environ if k.startswith(("VLLM_CPU", "ONEDNN", "LRU_CACHE")))}
    raise RuntimeError("stopped where vLLM would spawn on a GPU")


VLLMEngine.start = reached_spawn
asyncio.run(services.roles.start())
print(json.dumps({"asked": asked, "started": started, "error": services.roles._error,
                  "modules": sorted(m for m in sys.modules if m.startswith(("mia_engine", "mia_kernels")))}))
'''


def test_a_gpu_start_imports_no_cpu_code(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", GPU_START, str(FIXTURES), str(tmp_path / "data"),
                           str(ROOT / "configs" / "8xgpu.toml")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["asked"]
    # one group: a failed start ends the engines' start-up, so a second group would never have started
    assert set(seen["started"]) == {"qwen3-8b", "qwen2_5-vl-7b", "qwen3-32b"}, seen["error"]
    for name, engine in seen["started"].items():
        assert engine["additional_config"] == {} and engine["dtype"] == "bfloat16", name  # vLLM's, ours unsent
        assert engine["device_ids"] and engine["cpu_env"] == [], name
    assert "stopped where vLLM would spawn" in seen["error"]
    fenced = [m for m in seen["modules"] if m.startswith("mia_engine.engines.cpu")]
    assert fenced == [], fenced
