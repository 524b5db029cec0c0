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
import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from agent_platform.client_ip import ip_subject
from agents.api.config import api_setting
from agents.models import ApiKey

logger = logging.getLogger(__name__)

DEFAULT_RATE = "120/min"
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$", re.IGNORECASE)
_PERIOD_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest window a rate may count over: a cache (Redis among them) refuses a longer expiry, and a refused
# window would let every request through.
MAX_PERIOD_S = 31 * 86400


@dataclass(frozen=True)
class Rate:
    requests: int
    period_s: int


def parse_rate(text: str) -> Rate | None:
    """``"60/min"``, ``"1000/hour"``, ``"5/10s"`` → ``Rate``; anything else (zero requests, a period longer than
    ``MAX_PERIOD_S``) → None."""
    found = _RATE.match(text or "")
    if found is None:
        return None
    requests, multiplier, unit = int(found.group(1)), int(found.group(2) or 1), found.group(3).lower()[0]
    if requests < 1 or multiplier < 1 or multiplier * _PERIOD_S[unit] > MAX_PERIOD_S:
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


def _window_count(cache_key: str, timeout_s: int) -> int:
    """Add one to a fixed window's counter (created at 0 if absent) and return the new count: in one round trip
    on Redis (``agent_platform.redis_cache``), else by ``add`` and ``incr``."""
    window_count = getattr(cache, "window_count", None)
    if window_count is not None:
        return int(window_count(cache_key, timeout_s))
    cache.add(cache_key, 0, timeout=timeout_s)
    try:
        return int(cache.incr(cache_key))
    except ValueError:  # expired between add and incr
        cache.add(cache_key, 0, timeout=timeout_s)
        return int(cache.incr(cache_key))


def _bad_key_rate() -> Rate:
    text = str(api_setting("PLATFORM_API_BAD_KEY_RATE"))
    rate = parse_rate(text)
    if rate is None:
        logger.warning("PLATFORM_API_BAD_KEY_RATE %r is not a rate like 20/15min; using 20/15min", text)
        rate = Rate(requests=20, period_s=900)
    return rate


def _bad_key_cache_key(ip: str, rate: Rate, window: int) -> str:
    # Counted per client as ``ip_subject`` has it: an IPv6 client by its /64, or each address of it (one host may
    # take a new one for every request) would have its own count. Text that is no address (``unknown``) as it is.
    subject = ip_subject(ip) or ip
    return f"throttle:bad_key:ip:{subject}:{rate.requests}/{rate.period_s}:{window}"


def bad_key_wait(ip: str, *, now: float | None = None) -> float | None:
    """None if requests from ``ip`` may still present an API key; else the seconds until they may. A client (an
    IPv4 address, an IPv6 /64) past ``PLATFORM_API_BAD_KEY_RATE`` unknown or revoked keys is refused whatever key
    it sends, so guessing learns nothing more until the window ends. One read (a known key's only cost); fails
    open when the cache cannot be reached."""
    rate = _bad_key_rate()
    now = time.time() if now is None else now
    window = int(now // rate.period_s)
    try:
        count = cache.get(_bad_key_cache_key(ip, rate, window)) or 0
    except Exception:
        logger.warning("rate limit cache unavailable; unknown-key throttle skipped", exc_info=True)
        return None
    return _bad_key_refusal(int(count) >= rate.requests, rate, window, now)


def bad_key_record(ip: str, *, now: float | None = None) -> float | None:
    """Count one request from ``ip`` with an unknown or revoked API key (with every address of its /64 if it is
    IPv6), and answer as :func:`bad_key_wait` does for it: None where it was within the allowance (its answer is
    "invalid key"), else the seconds until the client may present a key again. The count decides, not the read
    before the lookup: every request of a burst passed that read before any was counted (150 at once: 64 told
    "invalid" against an allowance of 20); now no more than the allowance is ever told so. A known key is never
    counted (a caller's own requests in flight never fill its allowance)."""
    rate = _bad_key_rate()
    now = time.time() if now is None else now
    window = int(now // rate.period_s)
    try:
        count = _window_count(_bad_key_cache_key(ip, rate, window), rate.period_s + 1)
    except Exception:
        logger.warning("rate limit cache unavailable; unknown key from %s not counted", ip, exc_info=True)
        return None
    return _bad_key_refusal(count > rate.requests, rate, window, now)


def _bad_key_refusal(refused: bool, rate: Rate, window: int, now: float) -> float | None:
    return max(1.0, math.ceil((window + 1) * rate.period_s - now)) if refused else None


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
        count = _window_count(cache_key, rate.period_s + 1)
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


# --- concurrent event streams per key ----------------------------------------------------------------------


@dataclass(frozen=True)
class StreamSlot:
    """One of a key's ``PLATFORM_SSE_MAX_STREAMS_PER_KEY`` stream slots, held by one open stream.

    A slot is a cache entry with a lease: the stream renews it while it is open (``stream_slot_renew``) and
    deletes it when it closes (``stream_slot_release``); a stream whose process died frees its slot when the
    lease runs out. So the count holds across every web process that shares the cache, and never leaks."""

    cache_key: str
    token: str


def stream_slot_acquire(api_key: ApiKey, *, lease_s: float) -> StreamSlot | None:
    """A free slot of ``api_key``, now held, or None when all are taken. Fails open (a slot that is not
    counted) when the cache cannot be reached."""
    token = secrets.token_hex(8)
    limit = int(api_setting("PLATFORM_SSE_MAX_STREAMS_PER_KEY"))
    try:
        for index in range(limit):
            cache_key = f"sse:slot:{api_key.digest[:32]}:{index}"
            if cache.add(cache_key, token, timeout=math.ceil(lease_s)):  # atomic: one stream wins a slot
                return StreamSlot(cache_key=cache_key, token=token)
    except Exception:
        logger.warning("stream slot cache unavailable; stream of %s not counted", api_key.prefix, exc_info=True)
        return StreamSlot(cache_key="", token=token)
    return None


def stream_slot_renew(slot: StreamSlot, *, lease_s: float) -> None:
    if not slot.cache_key:
        return
    try:
        cache.touch(slot.cache_key, timeout=math.ceil(lease_s))
    except Exception:
        logger.warning("stream slot cache unavailable", exc_info=True)


def stream_slot_release(slot: StreamSlot) -> None:
    """Free the slot if this stream still holds it (a lapsed lease may have passed it to another stream)."""
    if not slot.cache_key:
        return
    try:
        if cache.get(slot.cache_key) == slot.token:
            cache.delete(slot.cache_key)
    except Exception:
        logger.warning("stream slot cache unavailable", exc_info=True)
