"""Django's Redis cache with two changes for what every API request does with it (the rate limits):

- one ``redis.Redis`` per connection pool, kept, instead of a new one per operation: building one fills a table
  of about 170 response callbacks, which cost more than the command itself;
- ``window_count``: a fixed window's counter created (with its expiry) if absent and incremented, atomically, in
  one round trip (``SET NX EX`` and ``INCR`` in one ``MULTI``); Django's ``add`` and ``incr`` take three.

Values are stored as Django's cache stores them (integers as their text), so ``cache.get`` reads the counters.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient as DjangoRedisCacheClient


class RedisCacheClient(DjangoRedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:  # a race makes two, of which one is kept: both are usable (the pool is shared)
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client

    def window_count(self, key: str, timeout: int) -> int:
        client = self.get_client(key, write=True)
        with client.pipeline(transaction=True) as pipe:
            pipe.set(key, 0, ex=timeout, nx=True)
            pipe.incr(key)
            _, count = pipe.execute()
        return int(count)


class RedisCache(DjangoRedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = RedisCacheClient

    def window_count(self, key: str, timeout: int, version: int | None = None) -> int:
        """Add one to the counter ``key`` (created at 0, expiring ``timeout`` seconds later, if absent) and
        return the new count: one round trip, atomic."""
        return self._cache.window_count(self.make_and_validate_key(key, version=version), timeout)
