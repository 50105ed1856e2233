"""Kill -9 target: writes to a real store in a loop and prints each acknowledged change.

Usage: python _writer.py DATA_DIR SEED. Prints "ready", then lines "add ID", "use ID U S" and
"del ID", each only after the store returned (i.e. after the journal fsync); "deleting ID" comes
before a delete, because a kill may land after the delete is durable but before its ack.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from mia_engine.config.memory import DurabilityConfig, MemoryConfig
from mia_engine.memory.entries import MemoryEntry, vector_to_bytes
from mia_engine.memory.store import ExperienceStore

DIM = 16
SNAPSHOT_INTERVAL = 5  # snapshots often, so some kills land in one


def main(data_dir: Path, seed: int) -> None:
    config = MemoryConfig(durability=DurabilityConfig(snapshot_interval=SNAPSHOT_INTERVAL))
    store = ExperienceStore.open(data_dir, config, DIM)
    rng = np.random.default_rng(seed)
    live = [record.id for record in store.export_records() if isinstance(record, MemoryEntry)]
    print("ready", flush=True)
    for step in range(1_000_000):
        if step % 7 == 6 and live:
            victim = live.pop(int(rng.integers(len(live))))
            print(f"deleting {victim}", flush=True)  # from here on the id may be gone without an ack
            store.delete(victim)
            print(f"del {victim}", flush=True)
        elif step % 3 == 2 and live:
            used = live[int(rng.integers(len(live)))]
            store.record_outcome([used], bool(rng.integers(2)))
            entry = store.get(used)
            print(f"use {used} {entry.num_uses} {entry.num_successes}", flush=True)
        else:
            live.append(_add(store, rng, step))
            print(f"add {live[-1]}", flush=True)


def _add(store: ExperienceStore, rng: np.random.Generator, step: int) -> str:
    vector = rng.standard_normal(DIM).astype(np.float32)
    entry = MemoryEntry(
        id=f"{step:06d}{rng.integers(1 << 40):012x}",
        modality="text",
        category="others",
        question=f"question {step}",
        workflow_summary="x" * int(rng.integers(1, 2000)),  # varied frame sizes
        label="correct" if rng.integers(2) else "incorrect",
        question_embedding=vector_to_bytes(vector / np.linalg.norm(vector)),
    )
    return store.add(entry).id


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
