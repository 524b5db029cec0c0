"""The client's address, as far as this process can trust it, and the forwarded headers it may believe.

A proxy in front of the platform tells it who the client is (``X-Forwarded-For``) and whether the client spoke
TLS (``X-Forwarded-Proto``, read by Django's ``SECURE_PROXY_SSL_HEADER`` under ``PLATFORM_TLS=proxy``). Those
headers are only believed from a proxy: a peer whose address is in ``PLATFORM_TRUSTED_PROXIES`` (networks, and
``unix`` for a unix socket; by default loopback, the private ranges and ``unix``, where a proxy of one's own sits:
set it to the proxies' own addresses where other hosts share those ranges). From any other peer
(``ForwardedHeadersMiddleware``) they are dropped before anything reads them: a client that reaches the web
server directly could otherwise claim 127.0.0.1 (and read ``/metrics``, dodge its login lockout and bad-key
throttle) or claim HTTPS.

An address is read by ``ipaddress`` wherever it comes from: a proxy that appends ``IP:port`` (Azure Application
Gateway, IIS ARR) or ``[v6]:port`` gives its host, and an entry that is no address at all is never taken for a
client's identity (the proxy's own address stands in, and it is logged once). The limits kept per client (the
login lockout, the unknown-key throttle) count an IPv6 client by its /64 (``ip_subject``), which one host normally
holds whole."""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

FORWARDED_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST", "HTTP_FORWARDED")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

logger = logging.getLogger(__name__)

# ``[2001:db8::1]:443``, ``[2001:db8::1]``, ``203.0.113.5:40001``: a host and the port a proxy appended.
_BRACKETED = re.compile(r"\[(?P<host>[^\]]+)\](?::[0-9]{1,5})?")
_WITH_PORT = re.compile(r"(?P<host>[^:]+):[0-9]{1,5}")
_unreadable_entry_logged = False


@functools.lru_cache(maxsize=8)
def _networks(configured: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in configured if part.strip())


def from_trusted_proxy(meta: Mapping[str, Any]) -> bool:
    """Whether the request's peer (``REMOTE_ADDR``) is in ``PLATFORM_TRUSTED_PROXIES``. A peer without an address
    (a unix socket: a proxy on this machine) is trusted where the list names ``unix``, as it does by default."""
    configured = tuple(settings.PLATFORM_TRUSTED_PROXIES)
    remote = str(meta.get("REMOTE_ADDR") or "").strip()
    if not remote:
        return "unix" in configured
    try:
        peer = ipaddress.ip_address(remote)
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return any(peer in network for network in _networks(tuple(n for n in configured if n != "unix")))


def ip_canonical(text: str) -> str | None:
    """The one spelling of an address that the record writes it in (the per-address limits count its client as
    ``ip_subject``, built on this): as ``ipaddress`` reads it (``2001:DB8:0::1`` → ``2001:db8::1``), an
    IPv4-mapped IPv6 address as its IPv4, so that both spellings meet (a dual-stack socket reports the IPv4 client
    10.0.0.7 as ``::ffff:10.0.0.7``, Python 3.11 writes that ``::ffff:a00:7``: each is ``10.0.0.7``). None where
    ``text`` is no address."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


# The IPv6 network one client is counted by: a host, a home or a cloud instance is normally given a whole /64 (and
# may take a new address in it for each request), so counting each address let one guesser be 2^64 clients.
IPV6_SUBJECT_PREFIX = 64


def ip_subject(text: str) -> str | None:
    """The client the per-address limits (the login lockout, the unknown-key throttle) count and lock ``text`` as:
    an IPv4 address as ``ip_canonical`` spells it (an IPv4-mapped one as its IPv4), an IPv6 address as its /64
    (``2001:db8:1:2::5`` → ``2001:db8:1:2::/64``). A /64 written as such (as a lockout names it, the host part
    set or not) is itself, so that an operator may name a lockout as it is recorded or by any address inside it.
    None where ``text`` is neither."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return _ipv6_subject_named(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        # From the integer: a scope (``fe80::1%eth0``) is no part of the network.
        return str(ipaddress.IPv6Network((int(address), IPV6_SUBJECT_PREFIX), strict=False))
    return ip_canonical(text)


def _ipv6_subject_named(text: str) -> str | None:
    """``2001:db8:1:2::/64`` (or ``2001:db8:1:2::5/64``) as ``ip_subject`` spells it; None for any other text,
    another prefix length among it: no lockout is kept under one."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen == IPV6_SUBJECT_PREFIX:
        return str(network)
    return None


def _spelled(address: Address) -> str:
    # An IPv4-mapped address keeps its form (``/metrics``' allowlist tells ``::ffff:0:0/96`` from ``10.0.0.0/8``),
    # its IPv4 part dotted, as Python 3.13 writes it (3.11 writes ``::ffff:a00:7``).
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return f"::ffff:{address.ipv4_mapped}"
    return str(address)


def _address_of(entry: str) -> Address | None:
    """The address of an ``X-Forwarded-For`` entry: the entry itself, or the host of ``IP:port`` and ``[v6]:port``
    (proxies that append the client's port). None where it is no address."""
    match = _BRACKETED.fullmatch(entry) or _WITH_PORT.fullmatch(entry)  # never an address as it stands
    try:
        return ipaddress.ip_address(match["host"] if match else entry)
    except ValueError:
        return None


def forwarded_client(meta: Mapping[str, Any]) -> str | None:
    """The address the outermost of ``PLATFORM_PROXY_HOPS`` trusted proxies (each appending to
    ``X-Forwarded-For``) saw, where the peer is one of them (``from_trusted_proxy``); entries further left are the
    client's own claims and are never used: anyone can send ``X-Forwarded-For``. None where no proxy says who the
    client is: no hops, a peer that is no trusted proxy, fewer entries than hops, or an entry that is no address
    (logged at warning once per process: a proxy that writes such entries leaves every client behind it with its
    own address)."""
    global _unreadable_entry_logged
    hops = int(getattr(settings, "PLATFORM_PROXY_HOPS", 0))
    if hops <= 0 or not from_trusted_proxy(meta):
        return None
    forwarded = [part.strip() for part in str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if part.strip()]
    if len(forwarded) < hops:
        return None
    address = _address_of(forwarded[-hops])
    if address is not None:
        return _spelled(address)
    if not _unreadable_entry_logged:
        _unreadable_entry_logged = True
        logger.warning(
            "X-Forwarded-For entry %r (PLATFORM_PROXY_HOPS=%d from the end) is no IP address; the proxy's own "
            "address is used as the client's (logged once)",
            forwarded[-hops][:64],
            hops,
        )
    return None


def client_ip(meta: Mapping[str, Any]) -> str:
    """The client's address: the one the trusted proxies forwarded (``forwarded_client``), else ``REMOTE_ADDR``.
    Spelled as ``ipaddress`` reads it, a port a proxy appended left off; an IPv4-mapped address keeps its form here
    (the record reads it as its IPv4: ``ip_canonical``; the per-address limits count an IPv6 client by its /64:
    ``ip_subject``). A ``REMOTE_ADDR`` that is no address (the web
    server's, never a client's, text) is returned as it is, to 64 characters; ``"unknown"`` when there is nothing
    to go by."""
    forwarded = forwarded_client(meta)
    if forwarded is not None:
        return forwarded
    remote = str(meta.get("REMOTE_ADDR") or "").strip()
    try:
        return _spelled(ipaddress.ip_address(remote))
    except ValueError:
        return remote[:64] or "unknown"


class ForwardedHeadersMiddleware:
    """Drops the forwarded headers (``FORWARDED_HEADERS``) of a request whose peer is no trusted proxy, before
    Django's security middleware (``X-Forwarded-Proto``) or ``client_ip`` read them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not from_trusted_proxy(request.META):
            for name in FORWARDED_HEADERS:
                request.META.pop(name, None)
        return self.get_response(request)
