"""``GET /v1/adapters`` shows, per version, the data-parallel replicas that hold it, as the engine reports
them (a fake engine with two replicas stands in: only the listing's logic is under test here; the real
replicas are checked end to end by tests/test_8xgpu_topology.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from mia_engine.engines.adapters import AdapterRegistry
from mia_engine.models.lora import write_lora_adapter
from mia_engine.server.adapters_api import adapter_routes

SMALL = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16,
         "num_hidden_layers": 1}


class _Replicas:
    """An engine with ``num_replicas`` data-parallel replicas; ``skip`` replicas never receive an adapter."""

    max_lora_rank = 4

    def __init__(self, num_replicas: int, skip: tuple[int, ...] = ()) -> None:
        self.loaded: list[set[int]] = [set() for _ in range(num_replicas)]
        self.skip = skip
        self.is_dead = False

    async def add_lora(self, request) -> bool:
        for rank, ids in enumerate(self.loaded):
            if rank not in self.skip:
                ids.add(request.lora_int_id)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        for ids in self.loaded:
            ids.discard(lora_id)
        return True

    async def loaded_loras(self) -> list[set[int]]:
        if self.is_dead:
            raise RuntimeError("engine core is dead")
        return [set(ids) for ids in self.loaded]


def _adapter(tmp_path: Path, name: str) -> Path:
    write_lora_adapter(tmp_path / name, SMALL, rank=4, alpha=8, target_modules=["q_proj"], seed=0, b_std=0.0,
                       base_model_name="small")
    return tmp_path / name


async def _listing(host: _Replicas, tmp_path: Path) -> list[dict]:
    registry = AdapterRegistry()
    await registry.register("planner", host, _adapter(tmp_path, "v1"))
    with TestClient(Starlette(routes=adapter_routes(registry))) as client:
        return client.get("/v1/adapters").json()["data"]


@pytest.mark.parametrize("skip, expected", [((), [0, 1]), ((1,), [0])])
async def test_each_version_lists_the_replicas_that_hold_it(tmp_path: Path, skip, expected) -> None:
    (info,) = await _listing(_Replicas(2, skip), tmp_path)
    assert info["version"] == 1 and info["loaded_replicas"] == expected and info["num_replicas"] == 2
    assert info["name"] == "planner@v1" and info["path"] is None  # no admin scope here: no folder shown


async def test_an_engine_that_does_not_answer_leaves_the_replicas_unknown(tmp_path: Path) -> None:
    host = _Replicas(2)
    host.is_dead = True
    (info,) = await _listing(host, tmp_path)
    assert info["version"] == 1 and info["loaded_replicas"] is None and info["num_replicas"] is None
