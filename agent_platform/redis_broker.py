"""The Redis broker: kombu's ``redis://`` transport, with one synchronous Redis client per channel.

kombu's Redis channel makes a new ``redis.Redis`` client for every command it sends outside its consumer's
connection (``Channel.conn_or_acquire``): each task published (the web server's ``apply_async`` for a run), and
in a worker each message taken (its entry in the unacknowledged set) and each acknowledgement. A client is cheap
to use but not to make (redis-py fills a table of about 170 response callbacks for each): about a sixth of the
CPU of publishing a run's task, profiled. This channel makes that client once and keeps it: a ``redis.Redis`` is
safe to share between threads (its connections come from the channel's pool, one per command), and it is made
again when the channel's pool is (kombu drops the pool when the connection is lost). Commands, keys and pools are
kombu's own, unchanged.

Selected by ``CELERY_BROKER_TRANSPORT`` where the broker URL is ``redis://`` (``agent_platform.settings``);
``rediss://`` and ``sentinel://`` keep kombu's transport.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

# Making a channel's client: threads that publish at once (a web server's) make it once between them.
_MAKING = threading.Lock()


class Channel(kombu_redis.Channel):
    _kept_client: tuple[Any, Any] | None = None  # (the pool it was made for, the client)

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """The client given, else this channel's kept client (made for the channel's current pool)."""
        if client:
            yield client
            return
        kept = self._kept_client
        # ``self._pool``, not ``self.pool``, outside the lock: the property makes the pool when there is none, and
        # two threads making one each left the kept client made for the pool that lost (a second client).
        if kept is None or kept[0] is not self._pool:
            with _MAKING:
                pool = self.pool
                kept = self._kept_client
                if kept is None or kept[0] is not pool:
                    kept = self._kept_client = (pool, self._create_client())
        yield kept[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
