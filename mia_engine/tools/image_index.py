"""A local image index for ``web_image_to_image_search``: ``python -m mia_engine index --images DIR``.

The reference's image search is a web reverse-image search (offline: results pre-fetched per question).
This is the local counterpart: every image under a folder, with a title, in a FAISS inner-product index
that the question's image is matched against. Titles come from ``captions.jsonl`` in the folder
(``{"file": <relative path>, "caption": ...}`` lines), else a ``<image>.txt`` beside the image, else
the file name (``eiffel_tower-night.jpg`` → "eiffel tower night").

The encoder (``tools.image_encoder``): ``thumbnail`` is training-free and always available: a 16x16
grey thumbnail (mean-centred) plus a 4x4x4 colour histogram, L2-normalised. It finds the same picture
resized, recompressed or slightly re-lit, and pictures of similar layout and colour, not the same
object photographed differently: a reverse-image search of the near-duplicate kind. A path to a local
sentence-transformers CLIP folder uses that model instead (semantic matches; nothing is downloaded).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import msgspec
import numpy as np
from PIL import Image
from tqdm import tqdm

from ..base.files import atomic_dir
from .image import IMAGE_SUFFIXES, ImageHit

log = logging.getLogger(__name__)

THUMBNAIL = "thumbnail"
MANIFEST, INDEX = "manifest.json", "index.faiss"


class ImageIndexManifest(msgspec.Struct):
    images_dir: str
    encoder: str
    fingerprint: str
    """Hash of the folder's image paths, sizes and modification times: a changed folder is re-indexed."""
    files: list[str]
    """Image paths relative to ``images_dir``, in index order."""
    captions: list[str]
    num_skipped: int = 0
    """Files with an image suffix that could not be decoded."""


def thumbnail_vector(image: Image.Image) -> np.ndarray:
    """(320,) float32, unit length: 0.8 x the centred grey 16x16 thumbnail, 0.6 x the 64-bin colour histogram."""
    rgb = image.convert("RGB")
    grey = np.asarray(rgb.convert("L").resize((16, 16), Image.Resampling.BOX), dtype=np.float32).ravel()
    grey -= grey.mean()
    grey /= np.linalg.norm(grey) + 1e-6
    bins = (np.asarray(rgb.resize((64, 64), Image.Resampling.BOX), dtype=np.int32) // 64).reshape(-1, 3)
    hist = np.bincount(bins[:, 0] * 16 + bins[:, 1] * 4 + bins[:, 2], minlength=64).astype(np.float32)
    hist /= np.linalg.norm(hist) + 1e-6
    vector = np.concatenate([0.8 * grey, 0.6 * hist])
    return (vector / (np.linalg.norm(vector) + 1e-6)).astype(np.float32)


def image_encoder(name: str) -> Callable[[list[Image.Image]], np.ndarray]:
    """(n, d) unit vectors of n images, by ``tools.image_encoder``."""
    if name == THUMBNAIL:
        return lambda images: np.stack([thumbnail_vector(image) for image in images])
    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise FileNotFoundError(f"tools.image_encoder: {name!r} is neither 'thumbnail' nor a local "
                                "sentence-transformers CLIP folder; nothing is downloaded")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return lambda images: np.asarray(model.encode(images, normalize_embeddings=True), dtype=np.float32)


def list_images(images_dir: Path) -> list[Path]:
    return sorted(p for p in images_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def fingerprint(images_dir: Path, files: list[Path], encoder: str) -> str:
    digest = hashlib.sha256(encoder.encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(images_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    captions = images_dir / "captions.jsonl"
    if captions.is_file():
        digest.update(captions.read_bytes())
    return digest.hexdigest()[:16]


def captions_of(images_dir: Path, files: list[Path]) -> list[str]:
    listed: dict[str, str] = {}
    sidecar = images_dir / "captions.jsonl"
    if sidecar.is_file():
        for line in sidecar.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                listed[str(row["file"])] = str(row["caption"]).strip()
            except (ValueError, KeyError, TypeError):
                continue
    out = []
    for path in files:
        text_file = path.with_suffix(".txt")
        caption = listed.get(str(path.relative_to(images_dir)), "")
        if not caption and text_file.is_file():
            caption = text_file.read_text(errors="replace").strip()
        out.append(caption or path.stem.replace("_", " ").replace("-", " "))
    return out


def build_image_index(images_dir: Path, out: Path, encoder_name: str = THUMBNAIL, *, batch_size: int = 64,
                      progress: bool = True) -> Path:
    """Index every image under ``images_dir`` into ``out`` (reused when the folder has not changed)."""
    images_dir = images_dir.expanduser().resolve()
    if not images_dir.is_dir():
        raise FileNotFoundError(f"--images: {images_dir} is not a folder")
    files = list_images(images_dir)
    key = fingerprint(images_dir, files, encoder_name)
    manifest_path = out / MANIFEST
    if manifest_path.is_file():
        old = msgspec.json.decode(manifest_path.read_bytes(), type=ImageIndexManifest)
        if old.fingerprint == key:
            log.info("image index %s is up to date (%d images)", out, len(old.files))
            return out
    encode = image_encoder(encoder_name)
    captions = captions_of(images_dir, files)
    kept, kept_captions, vectors, skipped = [], [], [], 0
    bar = tqdm(total=len(files), desc="images", unit="img", disable=not progress)
    for start in range(0, len(files), batch_size):
        batch, names = [], []
        for path, caption in zip(files[start:start + batch_size], captions[start:start + batch_size]):
            try:
                with Image.open(path) as image:
                    batch.append(image.convert("RGB"))
                names.append((path, caption))
            except Exception as err:  # noqa: BLE001 - one bad file must not stop the build
                skipped += 1
                log.warning("skipping %s: not a readable image (%s)", path, type(err).__name__)
        if batch:
            vectors.append(encode(batch))
            kept += [str(p.relative_to(images_dir)) for p, _ in names]
            kept_captions += [c for _, c in names]
        bar.update(len(files[start:start + batch_size]))
    bar.close()
    if not kept:
        raise ValueError(f"--images: no readable image under {images_dir}")
    matrix = np.concatenate(vectors)
    index = faiss.IndexFlatIP(matrix.shape[1])
    index.add(matrix)
    manifest = ImageIndexManifest(str(images_dir), encoder_name, key, kept, kept_captions, skipped)
    if out.exists():  # a changed folder: the old index goes (built whole or not at all below)
        shutil.rmtree(out)
    with atomic_dir(out) as tmp:
        faiss.write_index(index, str(tmp / INDEX))
        (tmp / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    log.info("image index %s: %d images (%d skipped)", out, len(kept), skipped)
    return out


def image_index_dir(config: Any) -> Path:
    """Where the image index lives: ``tools.image_index``, else ``<data_dir>/tools/image_index``."""
    tools = config.tools
    return Path(tools.image_index).expanduser() if tools.image_index else config.resolved_data_dir() / "tools" / "image_index"


def load_image_index(config: Any) -> LocalImageIndex | None:
    """The configured image index, or None when none was built (``tools.image_index`` must exist if set)."""
    folder = image_index_dir(config)
    if not (folder / MANIFEST).is_file():
        if config.tools.image_index:
            raise FileNotFoundError(f"tools.image_index: {folder} holds no image index "
                                    "(build one with python -m mia_engine index --images DIR)")
        return None
    index = LocalImageIndex(folder)
    log.info("image index %s: %d images (%s encoder)", folder, len(index.manifest.files), index.manifest.encoder)
    return index


class LocalImageIndex:
    """A built image index, searched with the question's image (encoding and search run in a thread)."""

    def __init__(self, folder: Path) -> None:
        self.manifest = msgspec.json.decode((folder / MANIFEST).read_bytes(), type=ImageIndexManifest)
        self._index = faiss.read_index(str(folder / INDEX))
        self._encode = image_encoder(self.manifest.encoder)

    def search(self, image: Any, top_k: int) -> list[ImageHit]:
        scores, rows = self._index.search(self._encode([image]), min(top_k, len(self.manifest.files)))
        root = Path(self.manifest.images_dir)
        return [ImageHit(str(root / self.manifest.files[row]), self.manifest.captions[row])
                for row in rows[0] if row >= 0]
