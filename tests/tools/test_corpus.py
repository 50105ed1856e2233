"""Corpora from the installed wiki file or jsonl; indexes built once, atomically, and reused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mia_engine.tools.corpus import (
    WIKI_OFFLINE,
    build_index,
    index_key,
    load_corpus,
    load_index,
    row_passage,
)


class FakeEncoder:
    """Deterministic unit vectors (index bookkeeping needs no real model)."""

    dim = 8

    def __init__(self) -> None:
        self.num_calls = 0

    def encode(self, texts):
        self.num_calls += 1
        rng = np.random.default_rng(len(texts))
        vectors = rng.normal(size=(len(texts), self.dim)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_wiki_offline_corpus(wiki_slice):
    full = load_corpus(WIKI_OFFLINE)
    assert len(full.passages) == 10_033 and full.name == WIKI_OFFLINE
    first = full.passages[0]
    assert first.title == "20th-century classical music" and first.contents.startswith(first.title + "\n")
    assert wiki_slice.passages == full.passages[:300]
    assert wiki_slice.identity != full.identity  # a slice is a different index


def test_jsonl_corpus_fields(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"title": "A", "text": "alpha"}, {"contents": '"B"\nbeta text'}, {"title": "C", "contents": "gamma"},
            {"title": "empty", "text": "  "}]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    corpus = load_corpus(str(path))
    assert corpus.name == "docs"
    assert [(p.title, p.text) for p in corpus.passages] == [("A", "alpha"), ("B", "beta text"), ("C", "gamma")]
    assert row_passage({"nothing": 1}) is None


def test_corpus_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_corpus(str(tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no passages"):
        load_corpus(str(tmp_path / "empty.jsonl"))
    parquet = tmp_path / "docs.parquet"
    parquet.write_bytes(b"PAR1")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pyarrow"):
            load_corpus(str(parquet))


def test_index_is_built_once_and_reused(tmp_path, wiki_slice):
    encoder = FakeEncoder()
    small = load_corpus(WIKI_OFFLINE, limit=50)
    folder = build_index(small, encoder, tmp_path, embedder_name="fake", batch_size=16, progress=False)
    assert encoder.num_calls == 4  # ceil(50 / 16) encode calls
    assert folder.name == index_key(small, "fake") and folder.parent == tmp_path
    assert build_index(small, encoder, tmp_path, embedder_name="fake", progress=False) == folder
    assert encoder.num_calls == 4  # reused, not re-encoded
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no temporary folder left behind
    index, passages, meta = load_index(folder)
    assert index.ntotal == 50 and passages == small.passages and meta.dim == 8 and meta.embedder == "fake"
    other = build_index(small, encoder, tmp_path, embedder_name="other", progress=False)
    assert other != folder and index_key(small, "fake", "passage: ") != index_key(small, "fake")


def test_failed_build_leaves_nothing(tmp_path):
    class Broken(FakeEncoder):
        def encode(self, texts):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_index(load_corpus(WIKI_OFFLINE, limit=5), Broken(), tmp_path, embedder_name="x", progress=False)
    assert list(Path(tmp_path).iterdir()) == []
