"""The Redis broker transport (``agent_platform.redis_broker``) on a real ``redis-server``: messages go through
kombu as with kombu's own transport, the channel makes its synchronous client once (not per command), makes a new
one when kombu replaced the channel's pool, and the settings pick it for ``redis://`` brokers only."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from agent_platform.redis_broker import Channel, Transport
from tests.e2e.harness import redis_server, settings_seen

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url


def _counting_clients(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    made: list[Any] = []
    create = Channel._create_client

    def counted(self: Channel, asynchronous: bool = False) -> Any:
        client = create(self, asynchronous=asynchronous)
        if not asynchronous:
            made.append(client)
        return client

    monkeypatch.setattr(Channel, "_create_client", counted)
    return made


def test_messages_go_through_and_the_channel_makes_its_client_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _counting_clients(monkeypatch)
    with Connection(redis_url, transport=Transport) as connection:
        queue = connection.SimpleQueue("t-runs")
        for n in range(5):
            queue.put({"run": f"김하늘-{n}"})
        got = []
        for _ in range(5):
            message = queue.get(timeout=5)
            got.append(message.payload["run"])
            message.ack()
        queue.close()

    assert got == [f"김하늘-{n}" for n in range(5)]
    # Five publishes, five takes (each recorded in the unacknowledged set) and five acks: one client in all.
    assert len(made) == 1


def test_threads_share_the_kept_client(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _counting_clients(monkeypatch)
    with Connection(redis_url, transport=Transport) as connection:
        channel = connection.default_channel
        errors: list[BaseException] = []

        def publish(n: int) -> None:
            try:
                for i in range(20):
                    with channel.conn_or_acquire() as client:
                        client.lpush("t-list", f"{n}-{i}")
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with channel.conn_or_acquire() as client:
            assert client.llen("t-list") == 160

    assert errors == []
    assert len(made) == 1


def test_a_new_pool_gets_a_new_client_and_a_client_given_is_used_as_it_is(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _counting_clients(monkeypatch)
    with Connection(redis_url, transport=Transport) as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first:
            first.set("k", "1")
        channel._disconnect_pools()  # what kombu does when the connection is lost: the pool is made again
        with channel.conn_or_acquire() as second:
            assert second.get("k") == b"1"
        assert second.connection_pool is channel.pool is not first.connection_pool
        given = object()
        with channel.conn_or_acquire(given) as client:
            assert client is given

    assert len(made) == 2 and made[0] is first and made[1] is second


@pytest.mark.parametrize(
    ("broker", "expected"),
    [
        ("redis://127.0.0.1:6379/0", "agent_platform.redis_broker:Transport"),
        ("rediss://127.0.0.1:6380/0", None),
        ("filesystem://", "agent_platform.embedded_broker:Transport"),
    ],
)
def test_the_settings_pick_it_for_plain_redis_brokers(broker: str, expected: str | None, tmp_path: Path) -> None:
    transport = settings_seen("getattr(settings, 'CELERY_BROKER_TRANSPORT', None)", tmp_path, CELERY_BROKER_URL=broker)

    assert transport == expected


def test_threads_that_find_no_pool_yet_make_one_client_between_them(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel's pool is made by a property on first use: two threads that each made one left the kept client
    made for the pool that lost, and a second client was made (a flaky failure of the test above)."""
    made = _counting_clients(monkeypatch)
    get_pool = Channel._get_pool

    def slow_pool(self: Channel, asynchronous: bool = False) -> Any:
        time.sleep(0.05)  # both threads find no pool yet
        return get_pool(self, asynchronous=asynchronous)

    monkeypatch.setattr(Channel, "_get_pool", slow_pool)
    with Connection(redis_url, transport=Transport) as connection:
        channel = connection.default_channel
        channel._pool = None
        channel._kept_client = None
        made.clear()

        def publish() -> None:
            with channel.conn_or_acquire() as client:
                client.lpush("p-list", "x")

        threads = [threading.Thread(target=publish) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(made) == 1
