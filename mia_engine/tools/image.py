"""Image-to-image search from a local cache of pre-fetched results (the reference's offline mode).

Layout: ``<cache_dir>/<data_id>/meta.json`` plus the image files. ``meta.json`` is a list of
results, or an object with one under ``results``/``images``; a result is a file name or an object
with a file (``path``/``image``/``file``) and a caption (``caption``/``title``/``text``/``snippet``).
Without a usable ``meta.json`` the folder's image files are returned uncaptioned.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec

from . import ToolUnavailable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp")
_FILE_KEYS = ("path", "image", "file", "image_path", "local_path")
_CAPTION_KEYS = ("caption", "title", "text", "snippet", "description")


class ImageHit(msgspec.Struct, frozen=True):
    path: str
    """Absolute path of the image file ("" when the result has no local file)."""
    caption: str = ""


class ImageSearch:
    """Image-to-image search: the question's image against a local image index (``index --images``)
    when one is loaded, else the pre-fetched results of the question's ``data_id`` (the reference's)."""

    def __init__(self, cache_dir: str, top_k: int = 3, local: Any = None) -> None:
        self._cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self._top_k = top_k
        self._local = local
        """A ``LocalImageIndex``, or None."""

    async def search(self, data_id: str, top_k: int | None = None, image: Any = None) -> list[ImageHit]:
        """Hits for the question's ``image`` (local index) or its ``data_id`` (cache); work runs in a thread."""
        if self._local is not None and image is not None:
            return await asyncio.to_thread(self._local.search, image, top_k or self._top_k)
        if self._cache_dir is None:
            raise ToolUnavailable("image search is off: build a local image index (python -m mia_engine index "
                                  "--images DIR) or set tools.image_cache_dir")
        if not data_id or "/" in data_id or data_id in (".", ".."):
            raise ToolUnavailable(f"image search has no cached results for question id {data_id!r}")
        folder = self._cache_dir / data_id
        return await asyncio.to_thread(read_cached_hits, folder, top_k or self._top_k)


def read_cached_hits(folder: Path, top_k: int) -> list[ImageHit]:
    if not folder.is_dir():
        raise ToolUnavailable(f"image search has no cached results for question id {folder.name!r}")
    hits = _meta_hits(folder)
    if not hits:
        hits = [ImageHit(str(p)) for p in sorted(folder.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES]
    return hits[:top_k]


def _meta_hits(folder: Path) -> list[ImageHit]:
    try:
        meta: Any = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return []
    if isinstance(meta, dict):
        meta = meta.get("results", meta.get("images", []))
    hits = [_hit(folder, item) for item in meta] if isinstance(meta, list) else []
    return [hit for hit in hits if hit is not None]


def _hit(folder: Path, item: Any) -> ImageHit | None:
    if isinstance(item, str):
        return ImageHit(_local(folder, item))
    if not isinstance(item, dict):
        return None
    file = next((str(item[k]) for k in _FILE_KEYS if isinstance(item.get(k), str)), "")
    caption = next((str(item[k]).strip() for k in _CAPTION_KEYS if item.get(k)), "")
    return ImageHit(_local(folder, file) if file else "", caption) if file or caption else None


def _local(folder: Path, name: str) -> str:
    """A file inside the question's folder (names may not climb out of it)."""
    path = (folder / name).resolve()
    return str(path) if path.is_relative_to(folder.resolve()) and path.is_file() else ""


def render_hits(hits: list[ImageHit]) -> str:
    if not hits:
        return "No similar images were found."
    return "\n".join(f"Image {i}(Title: {hit.caption or 'untitled'})" for i, hit in enumerate(hits, 1))
