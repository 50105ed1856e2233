"""A role's adapter removed while serving (``AdapterRegistry.unregister``, behind ``/v1/unload_lora_adapter``):
new requests find no version at once, the engine drops the LoRA only once the running requests end, and the
same name added again continues its numbering (a fresh LoRA name, so vLLM's prefix cache never serves the
old weights under it). A fake engine stands in: only the registry's bookkeeping is under test here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mia_engine.engines.adapters import AdapterError, AdapterNotFound, AdapterRegistry
from mia_engine.models.lora import write_lora_adapter

SMALL = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16,
         "num_hidden_layers": 1}


class _Engine:
    max_lora_rank = 4

    def __init__(self) -> None:
        self.loaded: dict[int, str] = {}

    async def add_lora(self, request) -> bool:
        self.loaded[request.lora_int_id] = request.lora_name
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        del self.loaded[lora_id]
        return True

    async def loaded_loras(self) -> list[set[int]]:
        return [set(self.loaded)]


def _adapter(folder: Path, seed: int) -> Path:
    write_lora_adapter(folder, SMALL, rank=4, alpha=8, target_modules=["q_proj"], seed=seed, b_std=0.1,
                       base_model_name="small")
    return folder


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_unregister_drains_then_removes_and_a_new_load_continues_the_numbering(tmp_path: Path) -> None:
    registry, engine = AdapterRegistry(), _Engine()
    first = await registry.register("sql", engine, _adapter(tmp_path / "a", 1))
    lease = registry.acquire("sql")
    lora = await lease.__aenter__()  # a request still running on the adapter
    removed = await registry.unregister("sql")
    assert removed is first and registry.current("sql") is None and not registry.serves("sql", engine)
    await _settle()
    assert engine.loaded == {first.lora_id: "sql@v1"}, "removed while a request still used it"
    assert await registry.loaded_loras("sql") == [{first.lora_id}]  # the draining version's engine answers
    with pytest.raises(AdapterError, match="has no adapter"):
        await registry.publish("sql", _adapter(tmp_path / "b", 2))
    await lease.__aexit__(None, None, None)
    await _settle()
    assert engine.loaded == {} and registry.versions() == []
    assert lora.lora_name == "sql@v1"

    again = await registry.register("sql", engine, _adapter(tmp_path / "c", 3))
    assert again.version == 2 and again.lora_id != first.lora_id and registry.serves("sql", engine)
    assert engine.loaded == {again.lora_id: "sql@v2"}


async def test_a_failed_register_leaves_the_name_unknown(tmp_path: Path) -> None:
    registry, engine = AdapterRegistry(), _Engine()
    with pytest.raises(AdapterNotFound):
        await registry.register("sql", engine, tmp_path / "missing")
    assert registry.current("sql") is None and not registry.serves("sql", engine)
    with pytest.raises(AdapterError, match="has no adapter"):
        await registry.publish("sql", _adapter(tmp_path / "a", 1))
    assert (await registry.register("sql", engine, tmp_path / "a")).version == 1
