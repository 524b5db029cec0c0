"""The client's address, as far as this process can trust it, and the forwarded headers it may believe.

A proxy in front of the platform tells it who the client is (``X-Forwarded-For``) and whether the client spoke
TLS (``X-Forwarded-Proto``, read by Django's ``SECURE_PROXY_SSL_HEADER`` under ``PLATFORM_TLS=proxy``). Those
headers are only believed from a proxy: a peer whose address is in ``PLATFORM_TRUSTED_PROXIES`` (networks, and
``unix`` for a unix socket; by default loopback, the private ranges and ``unix``, where a proxy of one's own sits:
set it to the proxies' own addresses where other hosts share those ranges). From any other peer
(``ForwardedHeadersMiddleware``) they are dropped before anything reads them: a client that reaches the web
server directly could otherwise claim 127.0.0.1 (and read ``/metrics``, dodge its login lockout and bad-key
throttle) or claim HTTPS."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

FORWARDED_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST", "HTTP_FORWARDED")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


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


def client_ip(meta: Mapping[str, Any]) -> str:
    """``REMOTE_ADDR``; behind ``PLATFORM_PROXY_HOPS`` trusted proxies (each appending to ``X-Forwarded-For``),
    the address the outermost of them saw, where the peer is one of them (``from_trusted_proxy``). Entries further
    left are the client's own claims and are never used: anyone can send ``X-Forwarded-For``. Returns
    ``"unknown"`` when there is nothing to go by."""
    remote = str(meta.get("REMOTE_ADDR") or "").strip()
    hops = int(getattr(settings, "PLATFORM_PROXY_HOPS", 0))
    if hops > 0 and from_trusted_proxy(meta):
        forwarded = [part.strip() for part in str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if part.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops][:64]
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
