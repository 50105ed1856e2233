"""Kill -9 target for the process-group test: concurrent writers on one real ``MemoryService``.

Usage: python _concurrent_writer.py DATA_DIR SEED. Prints "ready", then, from 8 concurrent tasks, one
line per acknowledged change: "add ID", "import ID ID ...", "del ID" (after "deleting ID"), and
"refused" for a write over the journal's record limit (it must never be stored). The encoder is a
deterministic hash (the test is about the journal, not about embeddings); everything else is real.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mia_engine.config.memory import DurabilityConfig, MemoryConfig
from mia_engine.memory.entries import MemoryEntry, RecordTooLarge, vector_to_bytes
from mia_engine.memory.service import MemoryService, NewMemory

DIM = 16
MAX_RECORD_BYTES = 256 * 1024
SNAPSHOT_INTERVAL = 7
NUM_TASKS = 8


def writer_config() -> MemoryConfig:
    return MemoryConfig(durability=DurabilityConfig(snapshot_interval=SNAPSHOT_INTERVAL,
                                                    max_record_bytes=MAX_RECORD_BYTES))


class HashEncoder:
    dim = DIM

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            vector = np.random.default_rng(seed).standard_normal(DIM)
            rows.append(vector / np.linalg.norm(vector))
        return np.asarray(rows, dtype=np.float32)

    def close(self) -> None:
        pass


def _size(rng: np.random.Generator) -> int:
    """Small, large, and over the record limit (about one write in six)."""
    kind = rng.integers(6)
    if kind == 0:
        return int(rng.integers(MAX_RECORD_BYTES + 1, 2 * MAX_RECORD_BYTES))
    if kind == 1:
        return int(rng.integers(MAX_RECORD_BYTES // 8, MAX_RECORD_BYTES // 2))
    return int(rng.integers(1, 4000))


async def _task(service: MemoryService, live: list[str], seed: int, task: int) -> None:
    rng = np.random.default_rng([seed, task])
    for step in range(1_000_000):
        tag = f"{seed}-{task}-{step}"
        try:
            if step % 9 == 8 and live:
                victim = live.pop(int(rng.integers(len(live))))
                print(f"deleting {victim}", flush=True)  # from here on the id may be gone without an ack
                await service.delete(victim)
                print(f"del {victim}", flush=True)
            elif step % 5 == 4:
                records = [_record(rng, f"{tag}-{i}") for i in range(int(rng.integers(1, 6)))]
                await service.import_records(records)
                live.extend(r.id for r in records)
                print("import " + " ".join(r.id for r in records), flush=True)
            else:
                memory = NewMemory(question=f"question {tag}", workflow_summary="1. **search**", label="correct",
                                   trajectory="t" * _size(rng))
                live.append((await service.add(memory)).id)
                print(f"add {live[-1]}", flush=True)
        except RecordTooLarge:
            print("refused", flush=True)


def _record(rng: np.random.Generator, tag: str) -> MemoryEntry:
    vector = rng.standard_normal(DIM)
    return MemoryEntry(id=f"imp-{tag}", modality="text", category="others", question=f"imported {tag}",
                       workflow_summary="w", label="incorrect", trajectory="i" * _size(rng),
                       question_embedding=vector_to_bytes(vector / np.linalg.norm(vector)))


async def main(data_dir: Path, seed: int) -> None:
    service = await MemoryService.open(data_dir, writer_config(), encoder=HashEncoder())
    live = [r.id for r in await service.export_records() if isinstance(r, MemoryEntry)]
    print("ready", flush=True)
    await asyncio.gather(*(_task(service, live, seed, task) for task in range(NUM_TASKS)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
