"""Every GPU component of the serving process runs under its own configured GPU and stream, checked on
the CPU: torch's CUDA device and stream selection is replaced by a recorder (a multi-GPU torch as far as
these calls go), and the real memory service, encoder and learner are started against it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from mia_engine.config import load_config
from mia_engine.devices import STREAM_PRIORITY, gpu_index, resolve_device, resolved_devices, thread_binder
from mia_engine.engines.adapters import AdapterRegistry
from mia_engine.config.learner import LearnerConfig
from mia_engine.learner.ttl import TestTimeLearner
from mia_engine.config.memory import EmbedderConfig, MemoryConfig
from mia_engine.memory.embedder import Embedder
from mia_engine.memory.service import MemoryService


class Selected(NamedTuple):
    thread: str
    device: torch.device
    priority: int


class FakeStream:
    """Stands for ``torch.cuda.Stream`` (a class: modules annotate with it at import time)."""

    def __init__(self, device: torch.device | None = None, priority: int = 0) -> None:
        self.device, self.priority = torch.device(device), priority


class FakeCuda:
    """Records which thread selected which device and stream (the calls ``devices.bind_thread`` makes)."""

    def __init__(self) -> None:
        self.selected: list[Selected] = []
        self._local = threading.local()

    def set_device(self, device: torch.device) -> None:
        device = torch.device(device)
        if device.index is None:  # what torch.cuda.set_device says to a bare "cuda"
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        self._local.device = device

    def set_stream(self, stream: FakeStream) -> None:
        assert stream.device == self._local.device, "a stream of another GPU than the thread's"
        self.selected.append(Selected(threading.current_thread().name, stream.device, stream.priority))

    def by_thread(self, prefix: str) -> list[Selected]:
        return [s for s in self.selected if s.thread.startswith(prefix)]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "set_device", fake.set_device)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "set_stream", fake.set_stream)
    yield fake


def test_names_resolve_to_the_gpu_the_budget_counts() -> None:
    assert [resolve_device(name, has_gpu=True) for name in ("cpu", "cuda", "cuda:7", "auto")] == \
        ["cpu", "cuda:0", "cuda:7", "cuda:0"]
    assert resolve_device("auto", has_gpu=False) == "cpu" and resolve_device("cuda", has_gpu=False) == "cuda:0"
    assert [gpu_index(name, has_gpu=True) for name in ("cpu", "cuda", "cuda:3", "auto")] == [None, 0, 3, 0]
    config = resolved_devices(load_config("tiny", {"memory.score_device": "auto", "learner.device": "cuda",
                                                   "tools.embedder.device": "cuda:2"}), has_gpu=True)
    assert (config.memory.score_device, config.learner.device, config.tools.embedder.device,
            config.memory.embedder.device) == ("cuda:0", "cuda:0", "cuda:2", "cpu")


def test_a_bare_cuda_binds_gpu_0_instead_of_failing_the_thread(fake_cuda: FakeCuda) -> None:
    """``doctor --checks contention`` passed ``cuda`` through, and torch's ``set_device`` refuses a device
    without an index: every bound thread pool broke in its initializer on the GPU."""
    with ThreadPoolExecutor(1, thread_name_prefix="bare", initializer=thread_binder("cuda", "serving")) as pool:
        pool.submit(lambda: None).result()
    assert fake_cuda.by_thread("bare") == [Selected("bare_0", torch.device("cuda:0"), STREAM_PRIORITY["serving"])]


async def test_the_memory_store_thread_runs_on_the_score_gpu(fake_cuda: FakeCuda, tmp_path: Path) -> None:
    """An empty store on GPU 7 allocates nothing there, so it opens on a CPU machine: its thread selects
    GPU 7 and a serving-priority stream before the store is built, and keeps them."""
    encoder = Embedder(EmbedderConfig(dtype="float32"))
    try:
        service = await MemoryService.open(tmp_path, MemoryConfig(score_device="cuda:7"), encoder=encoder)
        try:
            await service.search("a question")  # runs on the store thread
        finally:
            await service.close()
    finally:
        encoder.close()
    assert fake_cuda.by_thread("memory-store") == [
        Selected(fake_cuda.by_thread("memory-store")[0].thread, torch.device("cuda:7"), STREAM_PRIORITY["serving"])]


def test_the_encoder_thread_runs_on_its_gpu(fake_cuda: FakeCuda) -> None:
    with pytest.raises((AssertionError, RuntimeError)):  # CPU torch: the model cannot move to the GPU
        Embedder(EmbedderConfig(device="cuda:5", dtype="float32"))
    assert fake_cuda.by_thread("memory-embedder") == [
        Selected("memory-embedder", torch.device("cuda:5"), STREAM_PRIORITY["serving"])]


def test_the_learner_thread_runs_on_its_gpu_at_low_priority(fake_cuda: FakeCuda, tmp_path: Path) -> None:
    """``learner.process = "thread"``: the learner's thread binds its GPU (a learner process binds its own,
    ``tests/learner/test_learner_process.py``)."""
    learner = TestTimeLearner(LearnerConfig(device="cuda:6", process="thread"), AdapterRegistry(),
                              tmp_path / "checkpoints")
    try:
        name = learner._supervisor.thread.submit(lambda: threading.current_thread().name).result()
    finally:
        learner.close()
    assert fake_cuda.by_thread("ttl-learner") == [Selected(name, torch.device("cuda:6"),
                                                           STREAM_PRIORITY["learning"])]
    assert STREAM_PRIORITY["serving"] < STREAM_PRIORITY["learning"]  # torch: a lower number runs first


def test_cpu_components_select_nothing(fake_cuda: FakeCuda, tmp_path: Path) -> None:
    learner = TestTimeLearner(LearnerConfig(device="cpu"), AdapterRegistry(), tmp_path / "checkpoints")
    try:
        learner._supervisor.thread.submit(lambda: None).result()
    finally:
        learner.close()
    assert fake_cuda.selected == []
