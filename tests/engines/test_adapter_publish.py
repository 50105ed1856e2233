"""Publishing an adapter version checks every tensor of it off the event loop: a rank-64 adapter of a
Qwen3-8B-shaped model (the 8-GPU Planner's, ~0.33 GB in bf16) must not stall the requests being served."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mia_engine.engines.adapters import AdapterError, AdapterRegistry
from mia_engine.models.lora import init_adapter

QWEN3_8B = Path(__file__).parents[1] / "deploy" / "fixtures" / "qwen3-8b"
MAX_LAG_S = 0.020
PROBE_INTERVAL_S = 0.002


class _Host:
    """An engine as the registry sees it (the adapter's loading into vLLM is not what is measured)."""

    max_lora_rank = 64

    def __init__(self) -> None:
        self.loaded: list[str] = []

    async def add_lora(self, request) -> bool:
        self.loaded.append(request.lora_path)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return True


async def _max_lag_during(work) -> tuple[float, object]:
    """The longest the event loop was late for a 2 ms timer while ``work`` ran."""
    lags: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            due = time.perf_counter() + PROBE_INTERVAL_S
            await asyncio.sleep(PROBE_INTERVAL_S)
            lags.append(time.perf_counter() - due)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.05)  # the probe is running before the work starts
    try:
        result = await work
    finally:
        done.set()
        await task
    return max(lags), result


@pytest.fixture(scope="module")
def qwen3_8b_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_adapter(QWEN3_8B, tmp_path_factory.mktemp("adapter") / "r64", rank=64)


async def test_publishing_an_8b_adapter_keeps_the_event_loop_responsive(qwen3_8b_adapter: Path) -> None:
    registry, host = AdapterRegistry(), _Host()
    started = time.perf_counter()
    lag, version = await _max_lag_during(registry.register("planner", host, qwen3_8b_adapter))
    assert host.loaded == [str(qwen3_8b_adapter)] and version.version == 1
    assert time.perf_counter() - started > 5 * MAX_LAG_S  # the check did real work meanwhile
    assert lag <= MAX_LAG_S, f"the event loop stalled {lag * 1e3:.1f} ms during the publish"


async def test_a_refused_adapter_is_still_refused(qwen3_8b_adapter: Path) -> None:
    registry = AdapterRegistry()
    with pytest.raises(AdapterError, match="rank 64 is not in 1..8"):
        await registry.register("planner", type("Small", (_Host,), {"max_lora_rank": 8})(), qwen3_8b_adapter)


def test_checking_an_adapter_leaves_nothing_behind(tmp_path: Path) -> None:
    """Each publish reads every tensor of the adapter; a long-running server publishes thousands of versions,
    so a check may not leave objects behind (safetensors' ``get_tensor`` leaves two per tensor)."""
    import gc
    import tracemalloc

    from mia_engine.engines.adapters import check_adapter_dir

    adapter = init_adapter(QWEN3_8B, tmp_path / "r8", rank=8, target_modules=("q_proj",))
    for _ in range(5):
        check_adapter_dir(adapter, 8)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            check_adapter_dir(adapter, 8)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, f"100 checks of {adapter.name} left {grown} bytes behind"
