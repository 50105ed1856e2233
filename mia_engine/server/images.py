"""``image_url`` content parts → decoded, checked RGB images, or a 400 that names the part.

Sources: ``data:image/...;base64,`` URLs always; ``file://`` URLs and plain paths only under
``server.images.file_root`` (no symbolic link below it followed, regular files only); ``http(s)://`` only with
``server.images.allow_remote``, and only from public addresses (``remote_fetch``). The bytes decide the
format (a declared MIME type that disagrees is refused), the header's size is checked before any pixel
is decoded, and decoding runs in a worker thread: the event loop never parses an image.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import io
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import msgspec
from PIL import Image

from ..config import ImageInputConfig
from .errors import BadRequest
from .openai_bodies import ChatMessage, ImagePart
from .remote_fetch import FetchFailed, fetch_public, parse_networks, trusted_cas

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
    """The bytes of a regular file under ``file_root``, opened without following any symbolic link below the
    root (each folder, then the file, relative to the one before, so nothing swapped in meanwhile is
    followed) and without blocking (a FIFO or device is refused, not waited on); at most ``max_bytes`` read."""
    if not config.file_root:
        raise BadRequest("Local image files are not read by this server; send the image as a data URL "
                         "(or set server.images.file_root).", param=param, code="local_images_disabled")
    raw = unquote(urlparse(url).path) if url.lower().startswith("file:") else url
    if "\x00" in raw:
        raise BadRequest("The image path contains a NUL character.", param=param, code="image_path_not_allowed")
    root = Path(config.file_root).expanduser()
    names = _names_under(root, Path(raw))  # no ~: the client's path is not in the server's home
    if names is None:
        raise BadRequest("The image path is outside the folder this server reads images from.", param=param,
                         code="image_path_not_allowed")
    try:
        fd = _open_beneath(root.resolve(), names)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BadRequest("The image path is outside the folder this server reads images from (symbolic "
                             "links are not followed).", param=param, code="image_path_not_allowed") from None
        raise BadRequest("The image file cannot be read.", param=param) from None
    try:
        return _read_regular(fd, config.max_bytes, param)
    finally:
        os.close(fd)


def _names_under(root: Path, path: Path) -> list[str] | None:
    """The path's components below ``root`` after removing ``.`` and ``..`` as text; None if it leaves it."""
    if path.is_absolute():
        path = Path(os.path.normpath(path))
        for base in (Path(os.path.normpath(root)), root.resolve()):
            if path.is_relative_to(base):
                return list(path.relative_to(base).parts) or None
        return None
    relative = os.path.normpath(path)
    if relative == "." or relative == ".." or relative.startswith("../"):
        return None
    return list(Path(relative).parts)


def _open_beneath(root: Path, names: list[str]) -> int:
    """A read-only descriptor of ``root/names...``, each component opened with ``O_NOFOLLOW`` relative to
    the folder before it (``ELOOP`` on any symbolic link)."""
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names[:-1]:
            inner = _open_folder(name, folder)
            os.close(folder)
            folder = inner
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        return os.open(names[-1], flags, dir_fd=folder)
    finally:
        os.close(folder)


def _open_folder(name: str, parent: int) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except NotADirectoryError:  # what O_DIRECTORY says of a symbolic link, even to a folder
        if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, "a symbolic link", name) from None
        raise


def _read_regular(fd: int, max_bytes: int, param: str) -> bytes:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise BadRequest("The image path is not a regular file.", param=param, code="image_path_not_allowed")
    if info.st_size > max_bytes:
        raise BadRequest(f"The image is larger than {max_bytes} bytes.", param=param, code="image_too_large")
    data = bytearray()
    try:
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
    except OSError:
        raise BadRequest("The image file cannot be read.", param=param) from None
    if len(data) > max_bytes:  # grew since fstat
        raise BadRequest(f"The image is larger than {max_bytes} bytes.", param=param, code="image_too_large")
    return bytes(data)


async def _fetch(url: str, config: ImageInputConfig, param: str) -> bytes:
    """The body of ``url`` through the SSRF guard; every failure is the same 400."""
    try:
        allowed = parse_networks(config.remote_allowed_networks)
        return await fetch_public(url, config.max_bytes, config.fetch_timeout_s, allowed,
                                  trusted_cas(config.remote_ca_file))
    except FetchFailed as err:
        raise BadRequest(str(err), param=param, code="image_fetch_failed") from None


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
