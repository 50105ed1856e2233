"""Fixtures of the tool tests: the real all-MiniLM encoder (once per session) and a real FAISS index
over the first 300 passages of the installed wiki-offline corpus."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub from the tests

from mia_engine.config.memory import EmbedderConfig  # noqa: E402
from mia_engine.memory.embedder import Embedder  # noqa: E402
from mia_engine.tools.corpus import Corpus, build_index, load_corpus  # noqa: E402

NUM_PASSAGES = 300


class CountingEncoder:
    """The real encoder, counting forward requests (each ``encode_async`` call is one forward)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.num_async_calls = 0
        self.num_texts = 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def model_dir(self) -> Path:
        return self.inner.model_dir

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.encode(texts)

    async def encode_async(self, texts: Sequence[str]) -> np.ndarray:
        self.num_async_calls += 1
        self.num_texts += len(texts)
        return await self.inner.encode_async(texts)

    def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    encoder = Embedder(EmbedderConfig(batch_wait_ms=0.0, dtype="float32"))  # exact vectors on any CPU
    yield encoder
    encoder.close()


@pytest.fixture(scope="session")
def wiki_slice() -> Corpus:
    return load_corpus("wiki-offline", limit=NUM_PASSAGES)


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, wiki_slice: Corpus) -> Path:
    root = tmp_path_factory.mktemp("index")
    return build_index(wiki_slice, embedder, root, embedder_name="minilm", progress=False)


@pytest.fixture()
def counting(embedder: Embedder) -> CountingEncoder:
    return CountingEncoder(embedder)
