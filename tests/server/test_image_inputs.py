"""``image_url`` parts: what is accepted, and a 400 naming the part for everything else (pure logic)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import ipaddress
import os
import shutil
import socket
import ssl
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from PIL import Image

from mia_engine.config import ImageInputConfig
from mia_engine.server.errors import BadRequest
from mia_engine.server.images import load_images
from mia_engine.server.openai_bodies import ChatMessage, ImagePart, ImageURL, TextPart
from mia_engine.server.remote_fetch import is_public_address, parse_networks


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


async def test_a_nul_in_a_local_path_is_a_400(tmp_path: Path) -> None:
    config = ImageInputConfig(file_root=str(tmp_path))
    for url in ("file:///x%00.png", "x\x00.png", f"file://{tmp_path}/cat.png%00.txt"):
        assert (await refused(question(url), config)).code == "image_path_not_allowed", url


async def test_a_fifo_under_the_root_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.png")
    try:
        error = await asyncio.wait_for(refused(question("pipe.png"), ImageInputConfig(file_root=str(tmp_path))), 5)
    finally:  # without the fix a worker thread waits in open() for a writer: give it one
        with contextlib.suppress(OSError):
            os.close(os.open(tmp_path / "pipe.png", os.O_WRONLY | os.O_NONBLOCK))
    assert "not a regular file" in error.message


async def test_no_symbolic_link_below_the_root_is_followed(tmp_path: Path) -> None:
    (tmp_path / "album").mkdir()
    (tmp_path / "album" / "cat.png").write_bytes(encoded())
    (tmp_path / "inside.png").symlink_to(tmp_path / "album" / "cat.png")
    (tmp_path / "linked").symlink_to(tmp_path / "album")
    config = ImageInputConfig(file_root=str(tmp_path))
    assert len(await load_images(question("album/cat.png"), config)) == 1
    for url in ("inside.png", "linked/cat.png", f"file://{tmp_path}/linked/cat.png"):
        assert "symbolic links are not followed" in (await refused(question(url), config)).message, url


async def test_a_symlink_swapped_in_between_check_and_read_is_never_followed(tmp_path: Path) -> None:
    """A thread keeps replacing ``cat.png`` (a regular file) by a symlink to a file outside the root and back;
    no load may ever return the outside file's pixels."""
    root = tmp_path / "images"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(encoded(colour=(0, 0, 255)))
    (tmp_path / "plain.png").write_bytes(encoded(colour=(255, 0, 0)))
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.symlink(tmp_path / "secret.png", root / "tmp-link")
            os.replace(root / "tmp-link", root / "cat.png")
            shutil.copyfile(tmp_path / "plain.png", root / "tmp-file")
            os.replace(root / "tmp-file", root / "cat.png")

    swapper = threading.Thread(target=swap, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave often: the window between check and read is hit
    swapper.start()
    colours = []
    try:
        for _ in range(1500):
            with contextlib.suppress(BadRequest):
                (item,) = await load_images(question("cat.png"), ImageInputConfig(file_root=str(root)))
                colours.append(item.image.getpixel((0, 0)))
    finally:
        stop.set()
        swapper.join()
        sys.setswitchinterval(interval)
    assert colours and (0, 0, 255) not in colours


async def test_a_local_file_is_read_only_up_to_the_cap(tmp_path: Path) -> None:
    (tmp_path / "big.png").write_bytes(encoded(size=(300, 200)))
    error = await refused(question("big.png"), ImageInputConfig(file_root=str(tmp_path), max_bytes=100))
    assert error.code == "image_too_large"


@pytest.mark.parametrize("address, public", [
    ("93.184.215.14", True), ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True), ("8.8.8.8", True),
    ("127.0.0.1", False), ("127.1.2.3", False), ("::1", False), ("0.0.0.0", False), ("::", False),
    ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False), ("100.64.0.1", False),
    ("169.254.169.254", False), ("fd00:ec2::254", False), ("fe80::1", False), ("fec0::1", False),
    ("fc00::1", False), ("224.0.0.1", False), ("239.255.255.250", False), ("ff02::1", False),
    ("240.0.0.1", False), ("255.255.255.255", False), ("192.0.2.1", False), ("198.18.0.1", False),
    ("::ffff:127.0.0.1", False), ("::ffff:169.254.169.254", False), ("::ffff:8.8.8.8", True),
    ("2002:7f00:1::1", False), ("2002:a9fe:a9fe::1", False), ("2002:808:808::1", True),
    ("64:ff9b::a9fe:a9fe", False), ("64:ff9b::808:808", True), ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),
])
def test_only_public_addresses_are_fetched(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


def test_allowed_networks_open_an_internal_range_and_nothing_else() -> None:
    allowed = parse_networks(["10.1.0.0/16", "fd12::/16"])
    assert is_public_address(ipaddress.ip_address("10.1.2.3"), allowed)
    assert is_public_address(ipaddress.ip_address("fd12::5"), allowed)
    assert not is_public_address(ipaddress.ip_address("10.2.0.1"), allowed)
    assert not is_public_address(ipaddress.ip_address("169.254.169.254"), allowed)


class ImageHost:
    """A real HTTP server on 127.0.0.1 (a thread): ``/cat.png``, ``/slow.png`` (a byte every 0.1 s),
    ``/redirect`` (302 to ``/cat.png``), anything else 404; remembers each request's Host header. With
    ``tls`` (a certificate and its key), HTTPS, remembering the name each client sent in SNI."""

    def __init__(self, tls: trustme.LeafCert | None = None) -> None:
        import http.server

        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                host.hosts.append(self.headers.get("Host", ""))
                if self.path == "/cat.png":
                    self._send(200, encoded())
                elif self.path == "/slow.png":
                    self.send_response(200)
                    self.send_header("Content-Length", "200")
                    self.end_headers()
                    for _ in range(200):
                        if host.closing.is_set():
                            return
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.1)
                elif self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", "/cat.png")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(404, b"no")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.hosts: list[str] = []
        self.server_names: list[str | None] = []
        self.closing = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.configure_cert(context)
            context.sni_callback = lambda _sock, name, _context: self.server_names.append(name)  # type: ignore[func-returns-value]
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def image_host() -> Iterator[ImageHost]:
    host = ImageHost()
    yield host
    host.close()


REMOTE = ImageInputConfig(allow_remote=True, fetch_timeout_s=1.0)
LOOPBACK_ALLOWED = ImageInputConfig(allow_remote=True, fetch_timeout_s=1.0, remote_allowed_networks=["127.0.0.0/8"])


async def test_loopback_and_names_resolving_to_it_are_refused_before_connecting(image_host: ImageHost) -> None:
    for url in (f"http://127.0.0.1:{image_host.port}/cat.png", f"http://localhost:{image_host.port}/cat.png",
                f"http://2130706433:{image_host.port}/cat.png", f"http://[::ffff:127.0.0.1]:{image_host.port}/cat.png",
                "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/latest/meta-data/"):
        error = await refused(question(url), REMOTE)
        assert (error.message, error.code) == ("The image could not be fetched.", "image_fetch_failed"), url
    assert image_host.hosts == []


async def test_an_allowed_network_is_fetched_pinned_to_the_checked_address(image_host: ImageHost) -> None:
    (item,) = await load_images(question(f"http://localhost:{image_host.port}/cat.png"), LOOPBACK_ALLOWED)
    assert item.image.size == (40, 30)
    assert image_host.hosts == [f"localhost:{image_host.port}"]  # connected to the address, named in Host


async def test_a_trickling_server_hits_the_overall_deadline(image_host: ImageHost) -> None:
    start = time.monotonic()
    error = await refused(question(f"http://127.0.0.1:{image_host.port}/slow.png"), LOOPBACK_ALLOWED)
    assert error.message == "The image could not be fetched."
    assert time.monotonic() - start < 3  # a byte every 0.1 s never trips a per-read timeout of 1 s


async def test_every_fetch_failure_reads_the_same(image_host: ImageHost) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    port = image_host.port
    cases = [(f"http://10.0.0.1:{port}/cat.png", REMOTE), (f"http://127.0.0.1:{closed_port}/cat.png", LOOPBACK_ALLOWED),
             (f"http://127.0.0.1:{port}/slow.png", LOOPBACK_ALLOWED),
             (f"http://127.0.0.1:{port}/missing", LOOPBACK_ALLOWED),
             (f"http://127.0.0.1:{port}/redirect", LOOPBACK_ALLOWED), ("http://no-such-host.invalid/cat.png", REMOTE),
             (f"http://127.0.0.1:{port}/cat.png", ImageInputConfig(allow_remote=True, max_bytes=100,
                                                                   remote_allowed_networks=["127.0.0.1/32"]))]
    errors = {(e.message, e.code, e.param) for e in [await refused(question(url), config) for url, config in cases]}
    assert errors == {("The image could not be fetched.", "image_fetch_failed", "messages[1].content[1].image_url")}


async def test_https_is_pinned_to_the_checked_address_and_the_certificate_checked_for_the_name(
        tmp_path: Path) -> None:
    """A real TLS server on 127.0.0.1 with a certificate for ``localhost`` from a test CA: the fetch connects to
    the address it checked, and sends the name in SNI and Host, so the certificate is verified for the name
    (not for the address the connection was pinned to)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = ImageInputConfig(allow_remote=True, fetch_timeout_s=2.0, remote_allowed_networks=["127.0.0.0/8"],
                              remote_ca_file=str(ca_file))
    host = ImageHost(tls=ca.issue_cert("localhost"))
    try:
        (item,) = await load_images(question(f"https://localhost:{host.port}/cat.png"), config)
        assert item.image.size == (40, 30)
        assert (host.server_names, host.hosts) == (["localhost"], [f"localhost:{host.port}"])
        # the same server, no name to check its certificate for, or the public CAs only: refused
        for url, refusing in ((f"https://127.0.0.1:{host.port}/cat.png", config),
                              (f"https://localhost:{host.port}/cat.png", ImageInputConfig(
                                  allow_remote=True, fetch_timeout_s=2.0, remote_allowed_networks=["127.0.0.0/8"]))):
            error = await refused(question(url), refusing)
            assert (error.message, error.code) == ("The image could not be fetched.", "image_fetch_failed"), url
        assert host.hosts == [f"localhost:{host.port}"]  # no request was sent over an unverified connection
    finally:
        host.close()
    other = ImageHost(tls=ca.issue_cert("images.example.com"))  # a valid certificate, for another name
    try:
        error = await refused(question(f"https://localhost:{other.port}/cat.png"), config)
        assert error.code == "image_fetch_failed" and other.server_names == ["localhost"] and other.hosts == []
    finally:
        other.close()


def test_a_bad_allowed_network_is_a_config_error_naming_the_field() -> None:
    from mia_engine.config import ConfigError, load_config

    assert load_config("tiny", {"server.images.remote_allowed_networks": ["10.0.0.0/8"]})
    with pytest.raises(ConfigError, match="server.images.remote_allowed_networks: 'intranet' is not a network"):
        load_config("tiny", {"server.images.remote_allowed_networks": ["intranet"]})
    with pytest.raises(ConfigError, match="server.images.remote_ca_file: /nonexistent/ca.pem is not a file"):
        load_config("tiny", {"server.images.remote_ca_file": "/nonexistent/ca.pem"})
