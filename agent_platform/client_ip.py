"""The client's address, as far as this process can trust it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings


def client_ip(meta: Mapping[str, Any]) -> str:
    """``REMOTE_ADDR``; behind ``PLATFORM_PROXY_HOPS`` trusted proxies (each appending to ``X-Forwarded-For``),
    the address the outermost of them saw. Entries further left are the client's own claims and are never
    used: anyone can send ``X-Forwarded-For``. Returns ``"unknown"`` when there is nothing to go by."""
    remote = str(meta.get("REMOTE_ADDR") or "").strip()
    hops = int(getattr(settings, "PLATFORM_PROXY_HOPS", 0))
    if hops > 0:
        forwarded = [part.strip() for part in str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if part.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops][:64]
    return remote[:64] or "unknown"
