"""Fetching a client's ``http(s)://`` image URL without letting the client aim the server at its own network.

The name is resolved once, every address it resolves to must be public (``is_public_address``: not loopback,
private, link-local, cloud metadata, multicast, reserved or unspecified, also when embedded in an IPv6
address), and the connection goes to the checked address with the name only in ``Host`` and TLS SNI, so a
DNS answer that changes between check and connect (rebinding) cannot move it. Redirects are not followed,
no proxy from the environment is used, one deadline covers everything from DNS to the last byte (a server
trickling bytes cannot stretch it), and every failure is the same ``FetchFailed``: a client cannot tell a
refused destination from a closed port or a timeout, so the fetch cannot be used to scan.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import httpx

from ..base.log_text import printable

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NOT_GLOBAL_V4 = (ipaddress.IPv4Network("100.64.0.0/10"),)  # carrier-grade NAT (is_private misses it on 3.11)


class FetchFailed(Exception):
    """The image could not be fetched; the reason is logged (without the URL, which may carry credentials),
    never shown to the client."""


def is_public_address(address: Address, allowed: Sequence[Network] = ()) -> bool:
    """Whether the server may connect to ``address`` for a client: a globally routed unicast address, or one in
    ``allowed`` (the operator's ``server.images.remote_allowed_networks``)."""
    if any(address in network for network in allowed if network.version == address.version):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public_address(embedded, allowed)
        if address.is_site_local:
            return False
    if address.is_multicast or address.is_unspecified or address.is_reserved or address.is_link_local:
        return False
    if isinstance(address, ipaddress.IPv4Address) and any(address in net for net in _NOT_GLOBAL_V4):
        return False
    return address.is_global and not address.is_private and not address.is_loopback


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), which decides instead (Teredo is private)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def parse_networks(cidrs: Sequence[str]) -> tuple[Network, ...]:
    """``server.images.remote_allowed_networks`` as networks (``ValueError`` naming a bad one)."""
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def trusted_cas(ca_file: str) -> ssl.SSLContext | bool:
    """What ``fetch_public`` verifies server certificates against: the CAs in ``ca_file`` (one context per
    file, built once: loading a bundle takes milliseconds), or True for httpx's default public CAs."""
    return _context(str(Path(ca_file).expanduser())) if ca_file else True


@lru_cache(maxsize=4)
def _context(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)


async def fetch_public(url: str, max_bytes: int, timeout_s: float, allowed: Sequence[Network] = (),
                       verify: ssl.SSLContext | bool = True) -> bytes:
    """The body of ``url`` (HTTP 200 only, at most ``max_bytes``) from a checked, pinned public address, all
    within ``timeout_s``; any failure raises ``FetchFailed``. ``verify``: ``trusted_cas``."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _fetch(httpx.URL(url), max_bytes, timeout_s, allowed, verify)
    except FetchFailed as err:
        log.info("image fetch refused: %s", printable(str(err)))  # it names the request URL's host
    except TimeoutError:
        log.info("image fetch passed its %s s deadline", timeout_s)
    except Exception as err:  # noqa: BLE001 - httpx, DNS, sockets and URL parsing raise many types; all read the same
        log.info("image fetch failed: %s", type(err).__name__)
    raise FetchFailed("The image could not be fetched.")


async def _fetch(url: httpx.URL, max_bytes: int, timeout_s: float, allowed: Sequence[Network],
                 verify: ssl.SSLContext | bool) -> bytes:
    host = url.raw_host.decode("ascii")  # IDNA-encoded
    if url.scheme not in ("http", "https") or not host:
        raise FetchFailed("not an http(s) URL with a host")
    port = url.port or (443 if url.scheme == "https" else 80)
    address = await _checked_address(host, port, allowed)
    pinned = url.copy_with(host=str(address))
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}  # the certificate is checked for it
    headers = {"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"}  # raw bytes: no gzip bomb
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, trust_env=False, verify=verify) as client:
        request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            return await _body(response, max_bytes)
        finally:
            await response.aclose()


async def _checked_address(host: str, port: int, allowed: Sequence[Network]) -> Address:
    """The address to connect to: ``host`` itself if it is one, else the first it resolves to; refused unless
    every address the name resolves to is public (a name must not mix public and internal answers)."""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    if not addresses:
        raise FetchFailed(f"{host} resolves to no address")
    refused = [a for a in addresses if not is_public_address(a, allowed)]
    if refused:
        raise FetchFailed(f"{host} resolves to {refused[0]}, which is not a public address")
    return addresses[0]


async def _body(response: httpx.Response, max_bytes: int) -> bytes:
    if response.status_code != 200:
        raise FetchFailed(f"HTTP {response.status_code}")
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        raise FetchFailed("a compressed body")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise FetchFailed(f"Content-Length {declared} is over {max_bytes} bytes")
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise FetchFailed(f"more than {max_bytes} bytes")
    return bytes(body)
