"""``python -m mia_engine index``: build the configured corpus's passage index (cached; progress bar)."""

from __future__ import annotations

from pathlib import Path

from .config import MIAConfig
from .memory.embedder import Embedder
from .tools.corpus import build_index, index_root, load_corpus
from .tools.search import embedder_name


def build(config: MIAConfig) -> Path:
    tools = config.tools
    encoder = Embedder(tools.embedder)
    try:
        corpus = load_corpus(tools.corpus, tools.max_passages or None)
        return build_index(corpus, encoder, index_root(config), embedder_name=embedder_name(encoder),
                           passage_prefix=tools.passage_prefix, batch_size=tools.index_build_batch, progress=True)
    finally:
        encoder.close()
