"""Per-API-key rate limits, counted in Django's cache (Redis when ``REDIS_URL`` is set, so every web process
shares one count).

A fixed window per key: the first request of a window creates its counter (``cache.add``), every request
increments it (``cache.incr``, atomic in Redis and in the local-memory cache), and a request past the key's
limit is refused until the window ends (``Retry-After``). A window may see up to twice the rate across its
boundary with the next; in exchange the count is exact under any number of concurrent requests and
processes, which a read-modify-write history (DRF's ``SimpleRateThrottle``) is not.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from agents.api.config import api_setting
from agents.models import ApiKey

logger = logging.getLogger(__name__)

DEFAULT_RATE = "120/min"
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$", re.IGNORECASE)
_PERIOD_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Rate:
    requests: int
    period_s: int


def parse_rate(text: str) -> Rate | None:
    """``"60/min"``, ``"1000/hour"``, ``"5/10s"`` → ``Rate``; anything else (or zero requests) → None."""
    found = _RATE.match(text or "")
    if found is None:
        return None
    requests, multiplier, unit = int(found.group(1)), int(found.group(2) or 1), found.group(3).lower()[0]
    if requests < 1 or multiplier < 1:
        return None
    return Rate(requests=requests, period_s=multiplier * _PERIOD_S[unit])


def rate_for(api_key: ApiKey) -> Rate:
    """The key's own rate, else ``PLATFORM_API_RATE``. A malformed value is logged and the default used."""
    default_text = str(api_setting("PLATFORM_API_RATE"))
    default = parse_rate(default_text)
    if default is None:
        logger.warning("PLATFORM_API_RATE %r is not a rate like 120/min; using %s", default_text, DEFAULT_RATE)
        default = parse_rate(DEFAULT_RATE)
        assert default is not None
    if api_key.rate:
        own = parse_rate(api_key.rate)
        if own is not None:
            return own
        logger.warning("API key %s has a malformed rate %r; using the default", api_key.prefix, api_key.rate)
    return default


def api_key_rate_check(api_key: ApiKey, *, now: float | None = None) -> float | None:
    """Count one request of ``api_key``. Returns None if it is allowed, else the seconds until it would be.

    Fails open (allows, and logs) when the cache cannot be reached: an outage of Redis must not take the API
    down with it."""
    rate = rate_for(api_key)
    now = time.time() if now is None else now
    window = int(now // rate.period_s)
    # The digest, not the primary key: unique per issued key and never reused, unlike a rolled-back id.
    cache_key = f"throttle:api_key:{api_key.digest[:32]}:{rate.requests}/{rate.period_s}:{window}"
    try:
        cache.add(cache_key, 0, timeout=rate.period_s + 1)
        try:
            count = cache.incr(cache_key)
        except ValueError:  # expired between add and incr
            cache.add(cache_key, 0, timeout=rate.period_s + 1)
            count = cache.incr(cache_key)
    except Exception:  # any cache backend's failure (logged with its traceback)
        logger.warning("rate limit cache unavailable; request of %s allowed", api_key.prefix, exc_info=True)
        return None
    if count <= rate.requests:
        return None
    return max(1.0, math.ceil((window + 1) * rate.period_s - now))


class ApiKeyRateThrottle(BaseThrottle):
    """DRF throttle: one count per API key across every endpoint. Callers that are not an API key (a signed-in
    admin, say) are not limited here."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        user = getattr(request, "user", None)
        if not isinstance(user, ApiKey):
            return True
        self._wait = api_key_rate_check(user)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait
