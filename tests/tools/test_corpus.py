"""Corpora from the installed wiki file or jsonl; indexes built once, atomically, and reused."""

from __future__ import annotations

import importlib.util
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from mia_engine.tools.corpus import (
    WIKI_OFFLINE,
    BuildProgress,
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
        vectors = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts])
        vectors = vectors.astype(np.float32)  # (n, dim): each row a function of its text alone
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
    if importlib.util.find_spec("pyarrow") is None:
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
    # encoded longest first, stored in corpus order: row i is passage i's vector
    assert np.allclose(index.reconstruct_n(0, 50), encoder.encode([p.contents for p in small.passages]))
    other = build_index(small, encoder, tmp_path, embedder_name="other", progress=False)
    assert other != folder and index_key(small, "fake", "passage: ") != index_key(small, "fake")


def test_failed_build_leaves_nothing(tmp_path):
    class Broken(FakeEncoder):
        def encode(self, texts):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_index(load_corpus(WIKI_OFFLINE, limit=5), Broken(), tmp_path, embedder_name="x", progress=False)
    assert list(Path(tmp_path).iterdir()) == []


def test_build_progress_is_readable_while_the_index_builds(tmp_path):
    seen: list[str] = []
    tracker = BuildProgress()
    assert tracker.describe() == "preparing the search index" and tracker.eta_s() is None

    class Watching(FakeEncoder):
        def encode(self, texts):
            seen.append(tracker.describe())
            return super().encode(texts)

    small = load_corpus(WIKI_OFFLINE, limit=40)
    build_index(small, Watching(), tmp_path, embedder_name="w", batch_size=16, progress=False, tracker=tracker)
    assert seen[0].startswith("building the search index: 0/40 passages (0%)")
    assert seen[1].startswith("building the search index: 16/40 passages (40%), about ") and seen[1].endswith(" s left")
    assert (tracker.num_done, tracker.num_total) == (40, 40) and tracker.eta_s() == 0
