"""``image_url`` parts: what is accepted, and a 400 naming the part for everything else (pure logic)."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from mia_engine.config import ImageInputConfig
from mia_engine.server.errors import BadRequest
from mia_engine.server.images import load_images
from mia_engine.server.openai_bodies import ChatMessage, ImagePart, ImageURL, TextPart


def encoded(fmt: str = "PNG", size: tuple[int, int] = (40, 30), colour: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format=fmt)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def question(*urls: str) -> list[ChatMessage]:
    parts = [TextPart("What is shown?"), *(ImagePart(ImageURL(url)) for url in urls)]
    return [ChatMessage("system", "be brief"), ChatMessage("user", parts)]


def png_header_only(width: int, height: int) -> bytes:
    """A small PNG whose header claims ``width`` x ``height`` (a few bytes of pixel data follow): decoding
    it would allocate width x height x 3 bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("fmt, mime", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"),
                                       ("GIF", "image/gif")])
async def test_supported_formats_decode_to_rgb(fmt: str, mime: str) -> None:
    (item,) = await load_images(question(data_url(encoded(fmt), mime)), ImageInputConfig())
    assert (item.message, item.part, item.image.mode, item.image.size) == (1, 1, "RGB", (40, 30))
    assert item.param == "messages[1].content[1].image_url"


async def refused(messages: list[ChatMessage], config: ImageInputConfig = ImageInputConfig()) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        await load_images(messages, config)
    return info.value


@pytest.mark.parametrize("url, words", [
    (data_url(b"\x89PNG\r\n\x1a\n garbage that is not an image"), "not an image"),
    (data_url(b"just some text"), "not an image"),
    (data_url(encoded("PNG")[:60]), "truncated or corrupt"),
    (data_url(encoded("JPEG"), "image/png"), "says PNG but the bytes are JPEG"),
    (data_url(encoded(), "text/plain"), "Unsupported image type"),
    ("data:image/png;base64,@@@notbase64@@@", "not valid base64"),
    ("data:image/png,rawbytes", "data:image/png;base64"),
    (data_url(png_header_only(100_000, 100_000)), "pixels"),
    ("https://example.com/cat.png", "Remote image URLs are not fetched"),
    ("ftp://example.com/cat.png", "Unsupported image URL scheme"),
    ("/etc/passwd", "Local image files are not read"),
])
async def test_bad_images_are_refused_naming_the_part(url: str, words: str) -> None:
    error = await refused(question(url))
    assert words in error.message
    assert error.param == "messages[1].content[1].image_url"


async def test_size_limits_are_checked() -> None:
    big = encoded(size=(300, 200))
    assert "pixels" in (await refused(question(data_url(big)), ImageInputConfig(max_pixels=300 * 200 - 1))).message
    assert "larger than" in (await refused(question(data_url(big)), ImageInputConfig(max_bytes=100))).message
    two = question(data_url(encoded()), data_url(encoded()))
    error = await refused(two)
    assert "2 images" in error.message and error.param == "messages[1].content[2].image_url"
    assert len(await load_images(two, ImageInputConfig(max_images_per_request=2))) == 2


async def test_local_files_only_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "images"
    root.mkdir()
    (root / "cat.png").write_bytes(encoded())
    (tmp_path / "secret.png").write_bytes(encoded())
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    config = ImageInputConfig(file_root=str(root))
    for url in ("cat.png", str(root / "cat.png"), f"file://{root / 'cat.png'}"):
        (item,) = await load_images(question(url), config)
        assert item.image.size == (40, 30)
    for url in ("../secret.png", str(tmp_path / "secret.png"), "link.png", f"file://{root}/../secret.png"):
        assert "outside the folder" in (await refused(question(url), config)).message, url
    assert "cannot be read" in (await refused(question("missing.png"), config)).message
