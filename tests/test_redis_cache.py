"""The Redis cache (``agent_platform.redis_cache``) on a real ``redis-server``: Django's behaviour kept, one client
per connection pool, and the rate limits' window counter exact under concurrent requests in one round trip, with
its expiry set once, readable by ``cache.get``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from agent_platform.redis_cache import RedisCache
from agents.api.throttling import _window_count
from tests.e2e.harness import redis_server

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url


@pytest.fixture
def cache(redis_url: str) -> RedisCache:
    return RedisCache(redis_url, {"KEY_PREFIX": "t"})


def test_it_stores_and_reads_as_django_s_redis_cache_does(cache: RedisCache) -> None:
    cache.set("팀", {"name": "클라우드운영팀"}, timeout=60)
    assert cache.get("팀") == {"name": "클라우드운영팀"}
    assert cache.add("n", 1, timeout=60) is True and cache.add("n", 5, timeout=60) is False
    assert cache.incr("n") == 2
    with pytest.raises(ValueError):
        cache.incr("absent")
    assert cache.delete("팀") is True and cache.get("팀") is None


def test_one_client_serves_every_operation_of_a_pool(cache: RedisCache) -> None:
    first = cache._cache.get_client("a", write=True)
    assert cache._cache.get_client("b") is first
    assert cache._cache.get_client(None, write=True) is first


def test_the_window_counter_is_created_with_its_expiry_and_counted_in_one_round_trip(
    cache: RedisCache, redis_url: str
) -> None:
    raw = redis.Redis.from_url(redis_url)
    sent: list[int] = []
    client = cache._cache.get_client(write=True)
    pipeline_class = client.pipeline

    def counted_pipeline(*args: object, **kwargs: object) -> object:
        sent.append(1)
        return pipeline_class(*args, **kwargs)

    client.pipeline = counted_pipeline  # the same client: counts the pipelines it sends

    assert [cache.window_count("w", 30) for _ in range(3)] == [1, 2, 3]

    assert len(sent) == 3  # one pipeline (MULTI … EXEC: one round trip) per count
    key = cache.make_key("w")
    assert 0 < raw.ttl(key) <= 30  # the expiry set when the counter was created, not pushed back by a count
    assert cache.get("w") == 3  # stored as Django stores integers


def test_the_window_counter_is_exact_under_concurrent_requests(cache: RedisCache) -> None:
    counts: list[int] = []
    lock = threading.Lock()

    def requests() -> None:
        for _ in range(50):
            count = cache.window_count("busy", 60)
            with lock:
                counts.append(count)

    threads = [threading.Thread(target=requests) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(counts) == list(range(1, 401))  # every count given once: none lost, none twice


def test_the_rate_limits_count_through_it(redis_url: str, settings: object) -> None:
    settings.CACHES = {"default": {"BACKEND": "agent_platform.redis_cache.RedisCache", "LOCATION": redis_url}}  # type: ignore[attr-defined]
    from django.core.cache import cache, caches

    caches["default"].clear()
    assert [_window_count("throttle:k:1", 61) for _ in range(3)] == [1, 2, 3]
    assert cache.get("throttle:k:1") == 3
    assert 0 < redis.Redis.from_url(redis_url).ttl(cache.make_key("throttle:k:1")) <= 61


def test_an_unknown_key_burst_is_told_invalid_no_more_than_its_allowance(redis_url: str, settings: object) -> None:
    """``bad_key_record`` counts each unknown key and answers by the count, on Redis as on the local cache: 8
    threads of 10 failed lookups against an allowance of 20."""
    from agents.api.throttling import bad_key_record

    settings.CACHES = {"default": {"BACKEND": "agent_platform.redis_cache.RedisCache", "LOCATION": redis_url}}  # type: ignore[attr-defined]
    settings.PLATFORM_API_BAD_KEY_RATE = "20/15min"  # type: ignore[attr-defined]
    from django.core.cache import caches

    caches["default"].clear()
    told_invalid: list[bool] = []
    lock = threading.Lock()

    def burst() -> None:
        for _ in range(10):
            wait = bad_key_record("203.0.113.20")
            with lock:
                told_invalid.append(wait is None)

    threads = [threading.Thread(target=burst) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert told_invalid.count(True) == 20
