"""The CPU platform's engine-process choices, checked on this CPU with the platform's real code: the dtype
our engines ask for and what ``auto`` means to any other vLLM config, whether the engine schedules ahead
(through vLLM's own resolution) and which worker it runs, and the allocator the engine processes preload."""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms.cpu import CpuPlatform

from mia_engine.config import EngineConfig
from mia_engine.config.cpu import CpuEngineConfig
from mia_engine.base import cpu_features as features
from mia_engine.engines.cpu.malloc import RELEASE_RATE_ENV, preload_tcmalloc
from mia_engine.engines.cpu.options import ASYNC_SCHEDULING_KEY, MALLOC_KEY, engine_dtype
from mia_engine.engines.cpu.platform import VLLM_WORKER_CLS, WORKER_CLS, MIACpuPlatform
from mia_engine.engines.vllm_engine import VLLMEngine
from mia_engine.models.tiny import build_tiny

AVX2 = frozenset({"avx", "avx2", "fma"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    build_tiny(tmp_path / "tiny")
    return tmp_path / "tiny" / "base"  # a bfloat16 model (its config.json says so)


def _on_x86_with(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    """This CPU as an x86 one with ``flags``, wherever the CPU package reads them."""
    monkeypatch.setattr(features.platform, "machine", lambda: "x86_64")
    for name, module in list(sys.modules.items()):
        if name.startswith("mia_engine.engines.cpu") and hasattr(module, "cpu_flags"):
            monkeypatch.setattr(module, "cpu_flags", lambda *args: flags)


@pytest.mark.parametrize(("flags", "resolved"), [(AVX2, torch.float32), (AVX512_BF16, torch.bfloat16)])
def test_our_engine_runs_auto_in_float32_where_bf16_would_be_emulated(monkeypatch: pytest.MonkeyPatch,
                                                                        tiny_dir: Path, flags: frozenset[str],
                                                                        resolved: torch.dtype) -> None:
    """A bf16 model with ``dtype = "auto"``, resolved by vLLM from the engine args our engine builds."""
    import vllm.platforms

    assert isinstance(vllm.platforms.current_platform, MIACpuPlatform)
    _on_x86_with(monkeypatch, flags)
    engine = VLLMEngine("e", EngineConfig(model=str(tiny_dir), dtype="auto"), tiny_dir)
    assert engine._engine_args().create_model_config().dtype == resolved
    configured = VLLMEngine("e", EngineConfig(model=str(tiny_dir), dtype="bfloat16"), tiny_dir)
    assert configured._engine_args().create_model_config().dtype == torch.bfloat16  # a configured dtype wins


def test_a_vllm_config_without_our_keys_keeps_vllms_dtype(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    """The platform plugin is installed for every vLLM program in this environment; one that builds its
    config without our keys gets vLLM's own ``auto`` (bf16 on any x86 CPU), even where ours asks for float32."""
    import vllm.platforms

    assert isinstance(vllm.platforms.current_platform, MIACpuPlatform)
    _on_x86_with(monkeypatch, AVX2)
    assert MIACpuPlatform().supported_dtypes == CpuPlatform().supported_dtypes
    plain = AsyncEngineArgs(model=str(tiny_dir), dtype="auto")
    assert plain.create_model_config().dtype == torch.bfloat16


@pytest.mark.parametrize(("machine", "flags", "asked"), [("x86_64", AVX2, "float32"), ("x86_64", AVX512_BF16, "auto"),
                                                          ("aarch64", AVX2, "auto")])
def test_auto_asks_for_float32_only_on_an_x86_cpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch, machine: str,
                                                                       flags: frozenset[str], asked: str) -> None:
    monkeypatch.setattr(features.platform, "machine", lambda: machine)
    assert engine_dtype("auto", flags) == asked
    assert engine_dtype("bfloat16", flags) == "bfloat16"


def _finds(found: str | None):
    return lambda name: found if name == "tcmalloc_minimal" else None


def test_tcmalloc_goes_first_in_ld_preload_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", _finds("libtcmalloc_minimal.so.4"))
    env = {"LD_PRELOAD": "/torch/lib/libgomp.so.1"}
    assert preload_tcmalloc(env) == "libtcmalloc_minimal.so.4"
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:/torch/lib/libgomp.so.1"
    assert preload_tcmalloc(env) == "libtcmalloc_minimal.so.4"  # already there: not twice
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:/torch/lib/libgomp.so.1"
    empty: dict[str, str] = {}
    preload_tcmalloc(empty)
    assert empty == {"LD_PRELOAD": "libtcmalloc_minimal.so.4", RELEASE_RATE_ENV: "0"}


def test_tcmalloc_keeps_its_free_pages_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", _finds("libtcmalloc_minimal.so.4"))
    fresh: dict[str, str] = {}
    preload_tcmalloc(fresh)
    assert fresh[RELEASE_RATE_ENV] == "0"
    preloaded_by_user = {"LD_PRELOAD": "/opt/libtcmalloc.so"}
    preload_tcmalloc(preloaded_by_user)
    assert preloaded_by_user[RELEASE_RATE_ENV] == "0"
    users_rate = {RELEASE_RATE_ENV: "2.5"}
    preload_tcmalloc(users_rate)
    assert users_rate[RELEASE_RATE_ENV] == "2.5"


def test_without_tcmalloc_glibc_stays_and_the_log_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", _finds(None))
    env = {"LD_PRELOAD": "/torch/lib/libgomp.so.1"}
    with caplog.at_level("WARNING", logger="mia_engine.engines.cpu.malloc"):
        assert preload_tcmalloc(env) is None
    assert env == {"LD_PRELOAD": "/torch/lib/libgomp.so.1"}  # and no release rate for an allocator not there
    assert "libtcmalloc-minimal4" in caplog.text


class _Config:
    def __init__(self, extra: dict) -> None:
        self.additional_config = extra


@pytest.mark.parametrize(("extra", "preloaded"), [({MALLOC_KEY: "tcmalloc"}, True), ({MALLOC_KEY: "glibc"}, False),
                                                  ({}, False)])
def test_each_engine_config_picks_its_allocator(monkeypatch: pytest.MonkeyPatch, extra: dict,
                                                preloaded: bool) -> None:
    """Only an engine that asks preloads TCMalloc; a plain ``vllm serve`` (no key) keeps vLLM's choice."""
    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(lambda cls, config: None))
    monkeypatch.setattr(ctypes.util, "find_library", _finds("libtcmalloc_minimal.so.4"))
    monkeypatch.setenv("LD_PRELOAD", "/torch/lib/libgomp.so.1")
    monkeypatch.delenv(RELEASE_RATE_ENV, raising=False)
    MIACpuPlatform.check_and_update_config(_Config(extra))
    assert ("libtcmalloc_minimal.so.4" in os.environ["LD_PRELOAD"]) is preloaded
    assert (os.environ.get(RELEASE_RATE_ENV) == "0") is preloaded


def test_an_unknown_allocator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(lambda cls, config: None))
    with pytest.raises(ValueError, match=MALLOC_KEY):
        MIACpuPlatform.check_and_update_config(_Config({MALLOC_KEY: "jemalloc"}))


@pytest.fixture
def restored_environ() -> Iterator[None]:
    """vLLM's CPU platform writes ``LD_PRELOAD`` and more into ``os.environ`` while it builds a config;
    every server a later test starts would inherit them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize(("extra", "ahead"), [({}, None), ({"async_scheduling": True}, True),
                                              ({"async_scheduling": False}, False)])
@pytest.mark.usefixtures("restored_environ")
def test_vllms_engine_config_schedules_ahead_only_where_the_engine_asks(monkeypatch: pytest.MonkeyPatch,
                                                                        tiny_dir: Path, extra: dict,
                                                                        ahead: bool | None) -> None:
    """vLLM's whole config resolution on the platform. ``None``: the default (on). Without the key (a plain
    ``vllm serve``) the CPU platform's own choice stands: off."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = VLLMEngine("e", EngineConfig(model=str(tiny_dir), dtype="bfloat16", gpu_memory_utilization=0.3,
                                          cpu=CpuEngineConfig(malloc="glibc", **extra)), tiny_dir)
    args = engine._engine_args()
    config = args.create_engine_config()
    expected = ahead is not False
    assert config.scheduler_config.async_scheduling is expected
    assert (config.scheduler_config.get_scheduler_cls() is AsyncScheduler) is expected
    assert config.max_concurrent_batches == (2 if expected else 1)  # the engine core's batch queue
    assert config.parallel_config.worker_cls == WORKER_CLS  # our engine: the worker that rewinds seeded draws
    del args.additional_config[ASYNC_SCHEDULING_KEY]
    plain = args.create_engine_config()
    assert plain.scheduler_config.async_scheduling is False
    assert plain.parallel_config.worker_cls == VLLM_WORKER_CLS  # not our engine: vLLM's worker


def _vllm_config(**parts: object) -> SimpleNamespace:
    defaults = {"additional_config": {ASYNC_SCHEDULING_KEY: True}, "speculative_config": None,
                "model_config": SimpleNamespace(runner_type="generate"),
                "parallel_config": SimpleNamespace(pipeline_parallel_size=1),
                "scheduler_config": SimpleNamespace(async_scheduling=False)}
    return SimpleNamespace(**{**defaults, **parts})


@pytest.mark.parametrize(("parts", "reason"), [
    ({"speculative_config": object()}, "speculative decoding"),
    ({"model_config": SimpleNamespace(runner_type="pooling")}, "a pooling model"),
    ({"parallel_config": SimpleNamespace(pipeline_parallel_size=2)}, "pipeline parallelism"),
])
def test_what_vllm_refuses_to_schedule_ahead_stays_off(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture, parts: dict,
                                                       reason: str) -> None:
    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(lambda cls, config: None))
    config = _vllm_config(**parts)
    with caplog.at_level("WARNING", logger="mia_engine.engines.cpu.platform"):
        MIACpuPlatform.check_and_update_config(config)
    assert config.scheduler_config.async_scheduling is False and reason in caplog.text
    allowed = _vllm_config()
    MIACpuPlatform.check_and_update_config(allowed)
    assert allowed.scheduler_config.async_scheduling is True


def test_a_non_bool_async_scheduling_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(lambda cls, config: None))
    with pytest.raises(ValueError, match=ASYNC_SCHEDULING_KEY):
        MIACpuPlatform.check_and_update_config(_Config({ASYNC_SCHEDULING_KEY: "yes"}))
