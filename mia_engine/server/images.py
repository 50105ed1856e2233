"""``image_url`` content parts → decoded, checked RGB images, or a 400 that names the part.

Sources: ``data:image/...;base64,`` URLs always; ``file://`` URLs and plain paths only under
``server.images.file_root``; ``http(s)://`` only with ``server.images.allow_remote``. The bytes decide the
format (a declared MIME type that disagrees is refused), the header's size is checked before any pixel
is decoded, and decoding runs in a worker thread: the event loop never parses an image.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx
import msgspec
from PIL import Image

from ..config import ImageInputConfig
from .errors import BadRequest
from .openai_bodies import ChatMessage, ImagePart

MIME_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP",
                "image/gif": "GIF", "image/bmp": "BMP"}


class RequestImage(msgspec.Struct, frozen=True):
    """One decoded image of a request and where it was."""

    message: int
    part: int
    image: Any
    """RGB ``PIL.Image.Image``."""

    @property
    def param(self) -> str:
        return image_param(self.message, self.part)


def image_param(message: int, part: int) -> str:
    return f"messages[{message}].content[{part}].image_url"


def image_parts(messages: list[ChatMessage]) -> list[tuple[int, int, ImagePart]]:
    """(message index, part index, part) of every image part, in order."""
    return [(i, j, part) for i, m in enumerate(messages) if isinstance(m.content, list)
            for j, part in enumerate(m.content) if isinstance(part, ImagePart)]


async def load_images(messages: list[ChatMessage], config: ImageInputConfig) -> list[RequestImage]:
    """Every image part of ``messages`` decoded and checked; the first bad one raises ``BadRequest``."""
    parts = image_parts(messages)
    if len(parts) > config.max_images_per_request:
        raise BadRequest(f"{len(parts)} images in one request; this server accepts at most "
                         f"{config.max_images_per_request}.", param=image_param(*parts[config.max_images_per_request][:2]))
    loop = asyncio.get_running_loop()
    images = []
    for message, part, item in parts:
        param = image_param(message, part)
        data, declared = await _read(item.image_url.url, config, param)
        image = await loop.run_in_executor(None, decode_image, data, declared, config, param)
        images.append(RequestImage(message, part, image))
    return images


async def _read(url: str, config: ImageInputConfig, param: str) -> tuple[bytes, str | None]:
    """(the encoded bytes, the declared format or None) of an image URL."""
    url = url.strip()
    if url.startswith("data:"):
        return _data_url(url, config, param)
    scheme = urlparse(url).scheme.lower()
    if scheme in ("http", "https"):
        if not config.allow_remote:
            raise BadRequest("Remote image URLs are not fetched by this server; send the image as a data URL "
                             "(or set server.images.allow_remote).", param=param, code="remote_images_disabled")
        return await _fetch(url, config, param), None
    if scheme in ("", "file"):
        return await asyncio.to_thread(_local_file, url, config, param), None
    raise BadRequest(f"Unsupported image URL scheme {scheme!r}: use a data URL.", param=param)


def _data_url(url: str, config: ImageInputConfig, param: str) -> tuple[bytes, str | None]:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise BadRequest("A data URL must look like data:image/png;base64,<data>.", param=param)
    mime = header[len("data:"):-len(";base64")].strip().lower()
    if mime not in MIME_FORMATS:
        raise BadRequest(f"Unsupported image type {mime or '(none)'!r}; send one of "
                         f"{', '.join(sorted(set(MIME_FORMATS) - {'image/jpg'}))}.", param=param)
    if len(payload) * 3 // 4 > config.max_bytes + 3:  # refused before decoding the base64
        raise BadRequest(f"The image is larger than {config.max_bytes} bytes.", param=param, code="image_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("The data URL's payload is not valid base64.", param=param) from None
    return data, MIME_FORMATS[mime]


def _local_file(url: str, config: ImageInputConfig, param: str) -> bytes:
    if not config.file_root:
        raise BadRequest("Local image files are not read by this server; send the image as a data URL "
                         "(or set server.images.file_root).", param=param, code="local_images_disabled")
    root = Path(config.file_root).expanduser().resolve()
    raw = unquote(urlparse(url).path) if url.lower().startswith("file:") else url
    path = Path(raw).expanduser()
    path = (path if path.is_absolute() else root / path).resolve()
    if not path.is_relative_to(root):
        raise BadRequest("The image path is outside the folder this server reads images from.", param=param,
                         code="image_path_not_allowed")
    try:
        if path.stat().st_size > config.max_bytes:
            raise BadRequest(f"The image is larger than {config.max_bytes} bytes.", param=param,
                             code="image_too_large")
        return path.read_bytes()
    except OSError:
        raise BadRequest("The image file cannot be read.", param=param) from None


async def _fetch(url: str, config: ImageInputConfig, param: str) -> bytes:
    """The body of ``url``, stopped as soon as it passes ``max_bytes``."""
    chunks, size = [], 0
    try:
        async with httpx.AsyncClient(timeout=config.fetch_timeout_s, follow_redirects=False) as client:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise BadRequest(f"Fetching the image answered HTTP {response.status_code}.", param=param)
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > config.max_bytes:
                        raise BadRequest(f"The image is larger than {config.max_bytes} bytes.", param=param,
                                         code="image_too_large")
                    chunks.append(chunk)
    except httpx.HTTPError as err:
        raise BadRequest(f"The image could not be fetched: {type(err).__name__}.", param=param) from None
    return b"".join(chunks)


def decode_image(data: bytes, declared: str | None, config: ImageInputConfig, param: str) -> Any:
    """The RGB image in ``data``; refuses unknown or mismatched formats, oversized and corrupt images."""
    if len(data) > config.max_bytes:
        raise BadRequest(f"The image is larger than {config.max_bytes} bytes.", param=param, code="image_too_large")
    try:  # reads the header only
        image = Image.open(io.BytesIO(data), formats=list(config.formats))
    except Image.DecompressionBombError:  # Pillow's own ceiling, far above any sane max_pixels
        raise BadRequest(f"The image has more than {config.max_pixels} pixels.", param=param,
                         code="image_too_large") from None
    except Exception:  # noqa: BLE001 - Pillow raises many types for bytes it does not recognise
        raise BadRequest(f"The bytes are not an image in a supported format ({', '.join(config.formats)}).",
                         param=param, code="invalid_image") from None
    if declared is not None and image.format != declared:
        raise BadRequest(f"The data URL says {declared} but the bytes are {image.format}.", param=param,
                         code="invalid_image")
    width, height = image.size
    if width < 1 or height < 1 or width * height > config.max_pixels:
        raise BadRequest(f"The image is {width}x{height}; this server accepts at most {config.max_pixels} pixels.",
                         param=param, code="image_too_large")
    try:
        image.load()  # the first frame of an animation
        return image.convert("RGB")
    except Exception:  # noqa: BLE001 - truncated or corrupt pixel data
        raise BadRequest("The image data is truncated or corrupt.", param=param, code="invalid_image") from None
