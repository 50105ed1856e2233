"""One memory search through ``MemoryService`` (bucket lookup, the search worker's coalescer, the
store's thread, the scoring) over 20,000 stored entries. The sentence encoder is replaced by a fixed
random projection, so the figure is the store's path, not the encoder's forward pass."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from bench.bench_scaling import synthetic_entries
from mia_engine.config.memory import MemoryConfig
from mia_engine.memory.service import MemoryService

ENTRIES = 20_000


class HashEncoder:
    """Unit vectors from a hash of the text: the same text, the same vector; no model."""

    dim = 384

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            row = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.stack(rows)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    loop = asyncio.new_event_loop()
    config = MemoryConfig(max_num_stored=ENTRIES + 1000)
    encoder = HashEncoder()
    memory = loop.run_until_complete(MemoryService.open(Path(tmp_path_factory.mktemp("memory")), config,
                                                        encoder=encoder))
    have = 0
    while have < ENTRIES:
        have += loop.run_until_complete(memory.import_records(
            synthetic_entries(min(5000, ENTRIES - have), encoder.dim, list(config.categories), have)))
    yield loop, memory
    loop.run_until_complete(memory.close())
    loop.close()


def test_memory_search(benchmark, service) -> None:  # noqa: ANN001
    loop, memory = service
    questions = iter(f"Question {i}: which river flows through capital city {i}?" for i in range(10**9))
    result = benchmark(lambda: loop.run_until_complete(memory.search(next(questions))))
    assert result is not None
