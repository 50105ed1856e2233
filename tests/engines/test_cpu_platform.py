"""The CPU platform's two engine-process choices, checked on this CPU with the platform's real code: the
dtype ``auto`` resolves to (through vLLM's own resolution) and the allocator the engine processes preload."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import pytest
import torch
from vllm.platforms.cpu import CpuPlatform

from mia_engine.config import EngineConfig
from mia_engine.engines import cpu_platform
from mia_engine.engines.cpu_platform import MIACpuPlatform
from mia_engine.engines.startup import MALLOC_KEY, preload_tcmalloc
from mia_engine.engines.vllm_engine import VLLMEngine
from mia_engine.models.tiny import build_tiny

AVX2 = frozenset({"avx", "avx2", "fma"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    build_tiny(tmp_path / "tiny")
    return tmp_path / "tiny" / "base"  # a bfloat16 model (its config.json says so)


@pytest.mark.parametrize(("flags", "resolved"), [(AVX2, torch.float32), (AVX512_BF16, torch.bfloat16)])
def test_auto_dtype_is_float32_where_bf16_would_be_emulated(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path,
                                                            flags: frozenset[str], resolved: torch.dtype) -> None:
    """vLLM's own ``auto`` resolution, on the platform this package gives it, for a bf16 model."""
    import vllm.platforms

    assert isinstance(vllm.platforms.current_platform, MIACpuPlatform)
    monkeypatch.setattr(cpu_platform, "cpu_flags", lambda: flags)
    engine = VLLMEngine("e", EngineConfig(model=str(tiny_dir), dtype="auto"), tiny_dir)
    assert engine._engine_args().create_model_config().dtype == resolved
    configured = VLLMEngine("e", EngineConfig(model=str(tiny_dir), dtype="bfloat16"), tiny_dir)
    assert configured._engine_args().create_model_config().dtype == torch.bfloat16  # a configured dtype wins


def test_the_platform_keeps_vllms_dtypes_on_a_native_bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    platform = MIACpuPlatform()
    monkeypatch.setattr(cpu_platform, "cpu_flags", lambda: AVX512_BF16)
    assert platform.supported_dtypes == CpuPlatform().supported_dtypes
    monkeypatch.setattr(cpu_platform, "cpu_flags", lambda: AVX2)
    assert platform.supported_dtypes == [torch.float32]


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
    assert empty == {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}


def test_without_tcmalloc_glibc_stays_and_the_log_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", _finds(None))
    env = {"LD_PRELOAD": "/torch/lib/libgomp.so.1"}
    with caplog.at_level("WARNING", logger="mia_engine.engines.startup"):
        assert preload_tcmalloc(env) is None
    assert env == {"LD_PRELOAD": "/torch/lib/libgomp.so.1"}
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
    MIACpuPlatform.check_and_update_config(_Config(extra))
    assert ("libtcmalloc_minimal.so.4" in os.environ["LD_PRELOAD"]) is preloaded


def test_an_unknown_allocator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(lambda cls, config: None))
    with pytest.raises(ValueError, match=MALLOC_KEY):
        MIACpuPlatform.check_and_update_config(_Config({MALLOC_KEY: "jemalloc"}))
