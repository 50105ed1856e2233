"""Fixtures of the learner tests: one torch thread, and the tiny model built once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mia_engine.models.tiny import build_tiny


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine, two OpenMP threads that wait on each other
    under load turn a 40 ms step into seconds."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's folder (``base/`` and ``adapters/``)."""
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out)
    return out
