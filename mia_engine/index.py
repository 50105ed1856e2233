"""``python -m mia_engine index``: build the configured corpus's passage index, or with ``--images DIR`` a
local image index for image-to-image search (both cached; progress bar)."""

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


def build_images(config: MIAConfig, images_dir: Path) -> Path:
    """The image index of ``images_dir`` where ``serve`` looks for it (no text encoder is loaded)."""
    from .tools.image_index import build_image_index, image_index_dir

    return build_image_index(images_dir, image_index_dir(config), config.tools.image_encoder)
