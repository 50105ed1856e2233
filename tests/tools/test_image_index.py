"""The local image index: built by the real CLI from a folder of Pillow-made images, searched by the
``web_image_to_image_search`` tool with the question's image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageEnhance

from mia_engine.config.tools import ToolsConfig
from mia_engine.tools.image import ImageSearch
from mia_engine.tools.image_index import MANIFEST, LocalImageIndex, build_image_index
from mia_engine.tools.calls import ToolCall
from mia_engine.tools.registry import ToolContext, Tools


def picture(seed: int) -> Image.Image:
    """A distinct synthetic picture: a gradient background and a few shapes, colours from ``seed``."""
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, 160, dtype=np.float32)
    background = np.stack([np.outer(np.ones(120), base * rng.uniform(0.2, 1.0)),
                           np.outer(np.linspace(0, 255, 120) * rng.uniform(0.2, 1.0), np.ones(160)),
                           np.full((120, 160), rng.uniform(0, 255))], axis=-1).astype(np.uint8)
    image = Image.fromarray(background)
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x, y = int(rng.integers(0, 120)), int(rng.integers(0, 80))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw.rectangle([x, y, x + int(rng.integers(10, 40)), y + int(rng.integers(10, 40))], fill=colour)
    return image


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for i in range(8):
        picture(i).save(folder / f"landmark_{i}-photo.png")
    (folder / "sub").mkdir()
    picture(100).save(folder / "sub" / "tower.jpg", quality=90)
    (folder / "sub" / "tower.txt").write_text("Eiffel Tower at night\n")
    (folder / "captions.jsonl").write_text(json.dumps({"file": "landmark_3-photo.png", "caption": "Big Ben"}) + "\n")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    return folder


@pytest.fixture(scope="module")
def built(images_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("data")
    out = subprocess.run([sys.executable, "-m", "mia_engine", "index", "--images", str(images_dir), "--config", "tiny",
                          "--data-dir", str(data)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    folder = Path(out.stdout.strip().splitlines()[-1])
    assert folder == data / "tools" / "image_index"
    return folder


def altered(image: Image.Image) -> Image.Image:
    """The same picture as a user would send it again: smaller, JPEG-compressed, a little brighter."""
    import io

    small = image.resize((112, 84))
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=70)
    return ImageEnhance.Brightness(Image.open(buffer).convert("RGB")).enhance(1.1)


def test_the_cli_builds_every_readable_image_with_its_caption(built: Path) -> None:
    manifest = json.loads((built / MANIFEST).read_text())
    captions = dict(zip(manifest["files"], manifest["captions"]))
    assert len(captions) == 9 and manifest["num_skipped"] == 1  # broken.png skipped, counted
    assert captions["landmark_3-photo.png"] == "Big Ben"  # captions.jsonl
    assert captions["sub/tower.jpg"] == "Eiffel Tower at night"  # the .txt beside the image
    assert captions["landmark_5-photo.png"] == "landmark 5 photo"  # the file name


def test_an_altered_copy_finds_its_original_first(built: Path, images_dir: Path) -> None:
    index = LocalImageIndex(built)
    for seed, name in [(i, f"landmark_{i}-photo.png") for i in range(8)] + [(100, "sub/tower.jpg")]:
        hits = index.search(altered(picture(seed)), 3)
        assert Path(hits[0].path) == images_dir / name, (name, [h.path for h in hits])


def test_an_unchanged_folder_is_not_indexed_again(built: Path, images_dir: Path) -> None:
    before = (built / MANIFEST).stat().st_mtime_ns
    assert build_image_index(images_dir, built, progress=False) == built
    assert (built / MANIFEST).stat().st_mtime_ns == before


async def test_the_tool_searches_with_the_questions_image_once(built: Path) -> None:
    tools = Tools(ToolsConfig(), image=ImageSearch("", 2, LocalImageIndex(built)))
    context = ToolContext("q-1", image=altered(picture(100)))
    call = ToolCall("web_image_to_image_search", {"img_idx": "0"})
    observation = await tools.call(call, context, max_words=100)
    assert observation.is_success and observation.text.startswith("Image 1(Title: Eiffel Tower at night)")
    assert observation.images[0].endswith("sub/tower.jpg")
    again = await tools.call(call, context, max_words=100)
    assert not again.is_success and "only 1 time" in again.text


async def test_without_an_index_or_a_cache_the_tool_says_how_to_get_one() -> None:
    observation = await Tools(ToolsConfig()).call(ToolCall("web_image_to_image_search", {"img_idx": "0"}),
                                                  ToolContext("q", image=picture(1)), max_words=100)
    assert not observation.is_success and "index --images" in observation.text
