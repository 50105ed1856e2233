"""``memory.faiss_threads``: FAISS's OpenMP thread count on the store's thread, set when the store opens.
OpenMP keeps the count per thread, so it is read back on the thread that runs FAISS."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import faiss
import pytest

from mia_engine.memory.embedder import Embedder
from mia_engine.memory.service import MemoryService

from .factories import memory_config

ROOT = Path(__file__).resolve().parents[2]
needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                    reason="one CPU: FAISS's default is one thread already")


@needs_two_cpus
async def test_the_store_thread_runs_faiss_on_the_configured_threads(
        tmp_path: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mia_engine.memory.index")
    service = await MemoryService.open(tmp_path / "store", memory_config(faiss_threads=1), encoder=embedder)
    try:
        assert await service._run(faiss.omp_get_max_threads) == 1
    finally:
        await service.close()
    assert "memory: FAISS searches use 1 OpenMP thread (memory.faiss_threads = 1)" in caplog.messages


OPEN_ON_ONE_CPU = """
import os, sys
import faiss  # OpenMP counts the CPUs now: all of this process's
from mia_engine.config.memory import MemoryConfig
from mia_engine.memory.store import ExperienceStore

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # a CPU binding made after FAISS loaded
before = faiss.omp_get_max_threads()
store = ExperienceStore.open(sys.argv[1], MemoryConfig(faiss_threads=0), 8)
print(before, faiss.omp_get_max_threads(), len(os.sched_getaffinity(0)))
store.close()
"""


@needs_two_cpus
def test_zero_threads_means_the_cpus_the_store_thread_may_run_on(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", OPEN_ON_ONE_CPU, str(tmp_path / "store")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": ""})
    assert result.returncode == 0, result.stderr
    before, after, num_cpus = map(int, result.stdout.split())
    assert before >= 2 and (after, num_cpus) == (1, 1)


def test_a_negative_thread_count_is_refused() -> None:
    with pytest.raises(ValueError, match="faiss_threads must be >= 0"):
        memory_config(faiss_threads=-1)
