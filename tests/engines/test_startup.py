"""Start-up on a GPU box, checked on the CPU: spawn, placement through vLLM's ``device_ids``, which
engines may start together, and that nothing reaches CUDA in this process before the engines."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import psutil
import pytest
import torch

from mia_engine.config import EngineConfig, MIAConfig, load_config
from mia_engine.config.cpu import CpuEngineConfig
from mia_engine.engines.platforms import resolve_platform
from mia_engine.engines.roles import RoleServer
from mia_engine.engines.cpu.malloc import RELEASE_RATE_ENV, TCMALLOC_NAMES
from mia_engine.engines.startup import (GRAMMAR_CACHE_ENV, MULTIPROC_METHOD_ENV, cuda_components, engine_env,
                                        replica_for, start_groups, use_spawn)
from mia_engine.engines.vllm_engine import VLLMEngine
from mia_engine.services import Services


def test_use_spawn_sets_and_overrides_fork() -> None:
    env: dict[str, str] = {}
    use_spawn(env)
    assert env[MULTIPROC_METHOD_ENV] == "spawn"
    env[MULTIPROC_METHOD_ENV] = "fork"
    use_spawn(env)
    assert env[MULTIPROC_METHOD_ENV] == "spawn"


def spawn_env(config: MIAConfig, name: str) -> dict[str, str]:
    """Engine ``name``'s spawn environment on this machine's platform, as the role server asks for it."""
    return {**engine_env(config.engines[name]), **resolve_platform(config.cpu).spawn_env(config.engines[name])}


def test_the_role_server_makes_vllm_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROC_METHOD_ENV, "fork")
    RoleServer(load_config("tiny"))
    assert os.environ[MULTIPROC_METHOD_ENV] == "spawn"


def test_devices_reach_vllm_as_device_ids_not_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = EngineConfig(model="m", tensor_parallel_size=2, data_parallel_size=1, devices=[4, 5])
    args = VLLMEngine("e", config, tmp_path)._engine_args()  # a local folder, also under HF_HUB_OFFLINE
    assert args.device_ids == [4, 5] and args.tensor_parallel_size == 2
    assert args._resolve_device_ids() == [4, 5]  # vLLM's own resolution: physical ids
    served = load_config("tiny", {"engines.tiny.tensor_parallel_size": 2, "engines.tiny.devices": [4, 5]})
    assert "CUDA_VISIBLE_DEVICES" not in spawn_env(served, "tiny")
    assert VLLMEngine("e", EngineConfig(model="m"), tmp_path)._engine_args().device_ids is None


def test_the_kv_block_size_reaches_vllm_only_when_set(tmp_path: Path) -> None:
    """0 leaves vLLM's platform default (128 on CPU, 16 on GPUs) to vLLM."""
    assert VLLMEngine("e", EngineConfig(model="m"), tmp_path)._engine_args().block_size is None
    assert VLLMEngine("e", EngineConfig(model="m", block_size=64), tmp_path)._engine_args().block_size == 64


def test_the_cpu_kv_cache_reaches_vllm_in_bytes_fractions_of_a_gib_too(tmp_path: Path) -> None:
    """vLLM's legacy ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only; vLLM's own argument wins where set."""
    quarter = EngineConfig(model="m", cpu=CpuEngineConfig(kv_cache_space_gib=0.25))
    assert VLLMEngine("e", quarter, tmp_path)._engine_args().kv_cache_memory_bytes == 1 << 28
    own = EngineConfig(model="m", kv_cache_memory_bytes=123 << 20, cpu=CpuEngineConfig(kv_cache_space_gib=0.25))
    assert VLLMEngine("e", own, tmp_path)._engine_args().kv_cache_memory_bytes == 123 << 20


def test_cpu_settings_vllm_reads_only_from_the_environment_reach_the_spawned_processes() -> None:
    config = load_config("tiny", {"cpu.onednn_cache_capacity": 64,
                                  "engines.tiny.structured_outputs_cache_mib": 24})
    env = spawn_env(config, "tiny")
    assert env[GRAMMAR_CACHE_ENV] == "24"  # read by vLLM's engine core only (on every platform)
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == env["LRU_CACHE_CAPACITY"] == "64"  # oneDNN's and torch's


def test_the_served_engine_processes_start_with_the_spawn_env(tiny_server) -> None:
    """The real server's engine core and worker (spawned, so only their start environment counts)."""
    wanted = spawn_env(load_config("tiny"), "tiny")
    engine_processes = _engine_processes(tiny_server)
    assert engine_processes
    for process in engine_processes:
        environ = _start_environ(process)
        assert {key: environ.get(key) for key in wanted} == wanted, process.name()


@pytest.mark.skipif(not any(map(ctypes.util.find_library, TCMALLOC_NAMES)),
                    reason="no TCMalloc on this system (scripts/install.sh installs it where it may)")
def test_the_served_engine_processes_run_on_tcmalloc(tiny_server) -> None:
    """``cpu.malloc = "tcmalloc"`` (the default) as the engine processes have it mapped, not as configured,
    told to keep the pages it frees."""
    engine_processes = _engine_processes(tiny_server)
    assert engine_processes
    for process in engine_processes:
        assert "libtcmalloc" in Path(f"/proc/{process.pid}/maps").read_text(), process.name()
        if RELEASE_RATE_ENV not in os.environ:  # else a rate of the caller's own, kept (test_cpu_platform.py)
            assert _start_environ(process).get(RELEASE_RATE_ENV) == "0", process.name()


def _start_environ(process: psutil.Process) -> dict[str, str]:
    """The environment a process started with, from /proc as is (psutil's environ() came back empty for these
    renamed ``VLLM::...`` processes). Their new title overwrites the start of that block, so only variables
    the server added to its own environment, which come last, can be read back this way."""
    entries = Path(f"/proc/{process.pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def _engine_processes(server) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.process.pid).children(recursive=True)
            if "VLLM" in p.name() or "VLLM" in " ".join(p.cmdline())]


def test_8xgpu_engines_start_together_cpu_engines_one_by_one() -> None:
    config = load_config(str(Path(__file__).parents[2] / "configs" / "8xgpu.toml"))
    gpu = config.engines
    # distinct GPUs; a GPU platform adds nothing to the environment every engine gets
    assert start_groups(gpu, {name: engine_env(gpu[name]) for name in gpu}) == [list(gpu)]
    cpu = {"a": EngineConfig(model="x"), "b": EngineConfig(model="y")}
    assert start_groups(cpu, {"a": {}, "b": {}}) == [["a"], ["b"]]  # no devices: the default set, one at a time


def test_shared_gpu_or_different_spawn_env_start_apart() -> None:
    engines = {"a": EngineConfig(model="x", devices=[0]), "b": EngineConfig(model="y", devices=[0]),
               "c": EngineConfig(model="z", devices=[1]), "d": EngineConfig(model="w", devices=[2])}
    same = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    envs = {"a": same, "b": same, "c": same, "d": {"VLLM_CPU_KVCACHE_SPACE": "4"}}
    assert start_groups(engines, envs) == [["a", "c"], ["b"], ["d"]]
    assert start_groups(engines, dict.fromkeys(engines, {})) == [["a", "c", "d"], ["b"]]  # a GPU's: no env


def test_rollout_affinity_is_stable_and_spreads() -> None:
    assert replica_for("rollout-1", 2) == replica_for("rollout-1", 2)
    assert replica_for("abc", 4) == 891568578 % 4  # zlib.crc32(b"abc"): not Python's salted hash
    assert {replica_for(f"r{i}", 2) for i in range(16)} == {0, 1}
    engine = VLLMEngine("e", EngineConfig(model="m", data_parallel_size=2), Path("/m"))
    assert engine.replica("r7") == replica_for("r7", 2) and engine.replica(None) is None
    load = VLLMEngine("e", EngineConfig(model="m", data_parallel_size=2, routing="load"), Path("/m"))
    assert load.replica("r7") is None


def test_cuda_components_named_by_field() -> None:
    assert cuda_components(load_config("tiny")) == []
    config = load_config("tiny", {"memory.embedder.device": "cuda:7", "learner.device": "cuda:7"})
    assert cuda_components(config) == ["memory.embedder.device", "learner.device"]


async def _start_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict) -> list[str]:
    """Real Services wiring; spies on the engine start and on torch's first CUDA calls (its lazy CUDA
    initialisation, and the device a component's thread is bound to)."""
    calls: list[str] = []
    real_lazy_init, real_set_device = torch.cuda._lazy_init, torch.cuda.set_device

    def spy_lazy_init() -> None:
        calls.append("cuda-init")
        real_lazy_init()  # raises on this CPU machine, as a GPU-less torch does

    def spy_set_device(device: object) -> None:
        calls.append("cuda-init")
        real_set_device(device)  # raises here too

    monkeypatch.setattr(torch.cuda, "_lazy_init", spy_lazy_init)
    monkeypatch.setattr(torch.cuda, "set_device", spy_set_device)
    services = Services(load_config("tiny", {"data_dir": str(tmp_path), **overrides}))

    async def engines_start() -> None:
        calls.append("engines")

    async def memory_open(encoder: object) -> None:
        calls.append("memory")

    monkeypatch.setattr(services.roles, "start", engines_start)
    monkeypatch.setattr(services.memory, "open", memory_open)
    try:
        await services.start()
    finally:
        await services.stop()
    return calls


async def test_engines_start_before_a_cuda_encoder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = await _start_order(tmp_path, monkeypatch, {"memory.embedder.device": "cuda"})
    assert "cuda-init" in calls, calls  # the encoder did try to reach the GPU ...
    assert calls[0] == "engines", calls  # ... only after the engines were up


async def test_cpu_only_config_keeps_memory_before_engines(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = await _start_order(tmp_path, monkeypatch, {})
    assert calls == ["memory", "engines"]


@pytest.mark.slow
async def test_engines_started_together_leave_this_process_as_it_was(tmp_path: Path) -> None:
    """Two tiny engines start concurrently, as disjoint GPU engines do on the 8-GPU box: whatever vLLM's
    start-up writes into this process (environment variables, torch's thread count) is undone once they
    are up, however the two starts interleaved."""
    import threading

    from mia_engine.engines.roles import start_together
    from mia_engine.models.embedded import model_dir

    use_spawn()
    served = load_config("tiny")
    config = served.engines["tiny"]
    engines = [VLLMEngine(name, config, model_dir(config.model, tmp_path / "home")) for name in ("a", "b")]
    environ, num_threads = dict(os.environ), torch.get_num_threads()
    try:
        results = await start_together(engines, threading.Lock(), spawn_env(served, "tiny"))
        assert results == [None, None] and all(engine.is_running for engine in engines)
        changed = {k: (environ.get(k), os.environ.get(k)) for k in set(environ) | set(os.environ)
                   if environ.get(k) != os.environ.get(k)}
        assert changed == {}
        assert torch.get_num_threads() == num_threads
    finally:
        for engine in engines:
            engine.shutdown()
