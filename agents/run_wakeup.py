"""Waking whoever waits on a run (``?wait``, the event stream, the admin's live view) as soon as the run changes.

A run changes in a worker; its waiters sit in web processes. ``run_changed`` is called wherever a run's event is
written (``agents.run_state.RunEventWriter``: every status change comes with one, in the same transaction), and
tells the waiters once the change is committed, by what the setup has (``PLATFORM_RUN_WAKEUP``, ``auto``):

- ``redis``: a message on the pub/sub channel ``agent_platform:runs`` (the run's id), published when the
  transaction commits — where ``REDIS_URL`` or a ``redis://`` broker is set;
- ``postgres``: ``NOTIFY agent_platform_runs, '<run id>'`` in the writing transaction (PostgreSQL delivers it at
  commit and drops it on rollback) — on PostgreSQL without Redis;
- ``poll``: nothing is sent; waiters read the run again after a short pause that grows with the wait (5 ms at
  first, at most the caller's interval), so that a quick run is seen within milliseconds and a long wait costs
  few queries — the embedded default (SQLite, filesystem broker).

A notification is the run's id; one for an event after which ``?wait`` goes on waiting (a rule decision, a tool
result, a model turn, the ``running`` of a run that starts) is the id followed by ``:event``: the event stream
wakes on both, ``?wait`` only on the first, so a run's intermediate events cost its ``?wait`` caller no read. On
Redis the ``:event`` ones are published off the writer's path (a daemon thread): what gathered in the
``PLATFORM_RUN_EVENT_WAKEUP_GATHER_S`` (10 ms) after the first goes out in one pipeline, each message once, so a
run's rule decisions, tool result and model turn wake its streams once or twice instead of once each.

Each web process keeps one listening connection (``WakeHub``, a daemon thread, started by the first waiter) and
hands each notification to the waiters of that run. A notification can be lost (pub/sub delivers at most once, a
listener reconnects): a waiter therefore still reads the run again at its caller's interval, so a lost message
costs latency, never an answer. ``RunWatch.wait`` says whether a notification woke it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction

logger = logging.getLogger(__name__)

WakeupKind = Literal["redis", "postgres", "poll"]
REDIS_CHANNEL = "agent_platform:runs"
PG_CHANNEL = "agent_platform_runs"


def poll_min_s() -> float:
    """The first pause of a polling waiter (``PLATFORM_RUN_WAIT_MIN_POLL_S``, 5 ms); later pauses are a tenth of
    the time waited so far, up to the caller's interval: a run that takes 40 ms is seen within 5 ms of its end,
    one that takes 2 s within its interval."""
    return float(getattr(settings, "PLATFORM_RUN_WAIT_MIN_POLL_S", 0.005))


def redis_url() -> str:
    """The Redis the platform already uses (``REDIS_URL``, else a ``redis://`` broker), or ''."""
    if settings.REDIS_URL:
        return str(settings.REDIS_URL)
    broker = str(settings.CELERY_BROKER_URL or "")
    return broker if broker.startswith(("redis://", "rediss://")) else ""


WAKEUP_SETTINGS = ("auto", "redis", "postgres", "poll")
_unusable_logged = False


def wakeup_problem() -> str:
    """Why ``PLATFORM_RUN_WAKEUP`` cannot be had as set ('' when it can): an unknown value, ``postgres`` on
    another database, ``redis`` with no Redis (``agents.E004`` says so at start-up)."""
    configured = str(getattr(settings, "PLATFORM_RUN_WAKEUP", "auto") or "auto")
    if configured not in WAKEUP_SETTINGS:
        return f"PLATFORM_RUN_WAKEUP={configured!r} is not one of {', '.join(WAKEUP_SETTINGS)}."
    if configured == "postgres" and connection.vendor != "postgresql":
        return f"PLATFORM_RUN_WAKEUP=postgres needs PostgreSQL; the database is {connection.vendor}."
    if configured == "redis" and not redis_url():
        return "PLATFORM_RUN_WAKEUP=redis needs REDIS_URL or a redis:// broker; neither is set."
    return ""


def wakeup_kind() -> WakeupKind:
    configured = str(getattr(settings, "PLATFORM_RUN_WAKEUP", "auto") or "auto")
    if configured == "poll":
        return "poll"
    if configured in ("redis", "postgres"):
        problem = wakeup_problem()
        if not problem:
            return configured  # type: ignore[return-value]
        # A notification that cannot be sent must not fail the run's event writes (pg_notify on SQLite raised in
        # every one): its waiters poll instead, which costs latency, never an answer.
        global _unusable_logged
        if not _unusable_logged:
            _unusable_logged = True
            logger.warning("%s Waiters poll instead.", problem)
        return "poll"
    if redis_url():
        return "redis"
    if connection.vendor == "postgresql":
        return "postgres"
    return "poll"


# --- telling ---------------------------------------------------------------------------------------------------

_publisher: tuple[int, str, Any] | None = None


def _redis_client(url: str) -> Any:
    """One client per process and URL (its connection pool is not shared across a fork)."""
    global _publisher
    if _publisher is None or _publisher[0] != os.getpid() or _publisher[1] != url:
        import redis

        _publisher = (os.getpid(), url, redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2))
    return _publisher[2]


def _redis_publish(url: str, message: str) -> None:
    try:
        _redis_client(url).publish(REDIS_CHANNEL, message)
    except Exception:  # a waiter still reads the run at its interval
        logger.warning("run %s: could not publish its change to Redis", message, exc_info=True)


class _EventPublisher:
    """Publishes the notifications of events after which ``?wait`` goes on waiting (``<run id>:event``) from a
    daemon thread, so that a worker's run does not wait a Redis round trip for its start and each of its rule
    decisions, tool results and model turns. After the first message the thread waits
    ``PLATFORM_RUN_EVENT_WAKEUP_GATHER_S`` for more, then sends what gathered together (one pipeline, each
    message once): a stream wakes at most that much later, and reads every event written meanwhile. Only the
    event streams and live views wake on these; ``?wait``'s status changes are published by the writer at
    commit. A message lost here (the process ends) costs a stream its next poll, never an event."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pid = 0

    def put(self, url: str, message: str) -> None:
        if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
            with self.lock:
                if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
                    self.queue = queue.SimpleQueue()  # a forked child starts empty, with its own thread
                    self.pid = os.getpid()
                    self.thread = threading.Thread(target=self._loop, name="run-event-wakeups", daemon=True)
                    self.thread.start()
        self.queue.put((url, message))

    def _loop(self) -> None:
        pending = self.queue
        while True:
            batch = [pending.get()]
            gather_s = float(getattr(settings, "PLATFORM_RUN_EVENT_WAKEUP_GATHER_S", 0.01))
            if gather_s > 0:
                time.sleep(gather_s)  # the run's next events (and other runs') join this pipeline
            with contextlib.suppress(queue.Empty):
                while len(batch) < 1000:
                    batch.append(pending.get_nowait())
            self.publish(batch)

    @staticmethod
    def publish(batch: list[tuple[str, str]]) -> None:
        """Publish ``(url, message)`` pairs: one pipeline per Redis, each message once, in order."""
        by_url: dict[str, dict[str, None]] = {}
        for url, message in batch:
            by_url.setdefault(url, {})[message] = None
        for url, messages in by_url.items():
            try:
                pipeline = _redis_client(url).pipeline(transaction=False)
                for message in messages:
                    pipeline.publish(REDIS_CHANNEL, message)
                pipeline.execute()
            except Exception:  # a stream still reads the run's events at its interval
                logger.warning("could not publish %d run events' wake-ups to Redis", len(messages), exc_info=True)


_event_publisher = _EventPublisher()

EVENT_ONLY_SUFFIX = ":event"


def run_changed(*, run_id: Any, status_changed: bool = True) -> None:
    """Tell the run's waiters that it changed, once the current transaction commits (at once outside one);
    nothing is sent for a transaction that rolls back. Never raises for a lost notification.

    ``status_changed``: False for an event after which a ``?wait`` goes on waiting — one that leaves the run's
    status as it was, or the ``running`` of a run that starts (only the run's event streams and live views are
    woken; on Redis these go out from a background thread, several at once)."""
    kind = wakeup_kind()
    message = str(run_id) if status_changed else f"{run_id}{EVENT_ONLY_SUFFIX}"
    if kind == "redis":
        url = redis_url()
        if status_changed:
            transaction.on_commit(lambda: _redis_publish(url, message))
        else:  # the event streams' wake-up: off the writer's path, several in one round trip
            transaction.on_commit(lambda: _event_publisher.put(url, message))
    elif kind == "postgres":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PG_CHANNEL, message])


# --- listening ---------------------------------------------------------------------------------------------------


class WakeHub:
    """One listening connection per process (Redis pub/sub or PostgreSQL LISTEN) on a daemon thread, dispatching
    each notification to the callbacks registered for that run. ``add`` answers whether the hub is listening
    (subscribed before the caller reads the run, so no change after that read goes unnoticed)."""

    READY_TIMEOUT_S = 2.0

    def __init__(self, kind: Literal["redis", "postgres"], target: str | dict[str, Any]) -> None:
        self.kind = kind
        self.target = target
        # run id -> {callback: whether it wants status changes only}
        self.callbacks: dict[str, dict[Callable[[], None], bool]] = {}
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()

    def add(self, run_id: str, callback: Callable[[], None], *, statuses_only: bool = False) -> bool:
        """Register ``callback`` for ``run_id``'s notifications (``statuses_only``: only those of a status change).
        The waiter that starts the listener waits for its subscription (at most ``READY_TIMEOUT_S``); others are
        not held up while it reconnects (they poll)."""
        with self.lock:
            self.callbacks.setdefault(run_id, {})[callback] = statuses_only
            starting = self.thread is None or not self.thread.is_alive()
            if starting:
                self.thread = threading.Thread(target=self._loop, name=f"run-wakeup-{self.kind}", daemon=True)
                self.thread.start()
        return self.ready.wait(self.READY_TIMEOUT_S) if starting else self.ready.is_set()

    def remove(self, run_id: str, callback: Callable[[], None]) -> None:
        with self.lock:
            found = self.callbacks.get(run_id)
            if found is not None:
                found.pop(callback, None)
                if not found:
                    del self.callbacks[run_id]

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def dispatch(self, message: str) -> None:
        """Hand a notification (``<run id>``, or ``<run id>:event`` for an event that left the status as it was)
        to the run's waiters that want it."""
        event_only = message.endswith(EVENT_ONLY_SUFFIX)
        run_id = message[: -len(EVENT_ONLY_SUFFIX)] if event_only else message
        with self.lock:
            callbacks = [
                callback
                for callback, statuses_only in self.callbacks.get(run_id, {}).items()
                if not (event_only and statuses_only)
            ]
        for callback in callbacks:
            callback()

    def _loop(self) -> None:
        backoff_s = 0.1
        while not self.stop.is_set():
            try:
                if self.kind == "redis":
                    self._listen_redis()
                else:
                    self._listen_postgres()
                backoff_s = 0.1
            except Exception:  # reconnect; waiters poll at their interval meanwhile
                logger.warning("run wake-ups (%s): listening failed; reconnecting", self.kind, exc_info=True)
            finally:
                self.ready.clear()
            self.stop.wait(backoff_s)
            backoff_s = min(backoff_s * 2, 5.0)

    def _listen_redis(self) -> None:
        import redis

        client = redis.Redis.from_url(str(self.target), socket_connect_timeout=2, health_check_interval=30)
        pubsub = client.pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(REDIS_CHANNEL)
            while not self.stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self.ready.set()
                elif message["type"] == "message":
                    data = message["data"]
                    self.dispatch(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            pubsub.close()
            client.close()

    def _listen_postgres(self) -> None:
        import psycopg

        params = self.target if isinstance(self.target, dict) else {"conninfo": self.target}
        with psycopg.connect(**params, autocommit=True) as listener:
            listener.execute(f"LISTEN {PG_CHANNEL}")
            self.ready.set()
            while not self.stop.is_set():
                for notify in listener.notifies(timeout=1.0):
                    self.dispatch(notify.payload)


_hub: WakeHub | None = None
_hub_lock = threading.Lock()


# Keys of a database's OPTIONS that are Django's, not libpq's (psycopg.connect refuses them).
_DJANGO_ONLY_OPTIONS = frozenset(
    {"assume_role", "isolation_level", "pool", "server_side_binding", "prepare_threshold", "cursor_factory", "context"}
)


def _postgres_params() -> dict[str, Any]:
    """The listening connection's parameters: the database's, its OPTIONS included (``sslmode``, ``sslrootcert``,
    client certificates, ``connect_timeout``: without them it connected with libpq's defaults, TLS unverified)."""
    db = settings.DATABASES["default"]
    params = {
        **{k: v for k, v in (db.get("OPTIONS") or {}).items() if k not in _DJANGO_ONLY_OPTIONS},
        "dbname": db.get("NAME") or "",
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
    }
    return {k: v for k, v in params.items() if v is not None}


def wake_hub() -> WakeHub | None:
    """This process's hub, or None where waiters poll."""
    global _hub
    kind = wakeup_kind()
    if kind == "poll":
        return None
    target: str | dict[str, Any] = redis_url() if kind == "redis" else _postgres_params()
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid() or _hub.kind != kind or _hub.target != target:
            if _hub is not None and _hub.pid == os.getpid():
                _hub.close()
            _hub = WakeHub(kind, target)
        return _hub


# --- waiting ---------------------------------------------------------------------------------------------------


class RunWatch:
    """Waits for a run's next change. Use it as a context manager; read the run, and while it is not what you
    wait for, call ``wait`` (or ``wait_async`` in async code) and read again.

    ``wait(interval_s)`` returns True when a notification woke it, False after a pause: the pause is
    ``interval_s`` where a hub listens (the safety net for a lost notification), and otherwise a short adaptive
    one (``poll_min_s()``, growing to a tenth of the time waited, at most ``interval_s``)."""

    def __init__(
        self, run_id: Any, *, hub: WakeHub | Literal["auto"] | None = "auto", statuses_only: bool = False
    ) -> None:
        self.run_id = str(run_id)
        self.statuses_only = statuses_only
        self.hub = wake_hub() if hub == "auto" else hub
        self.started = time.monotonic()
        self.event = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.async_event: asyncio.Event | None = None
        self.listening = False
        self.min_pause_s = poll_min_s()

    def __enter__(self) -> RunWatch:
        if self.hub is not None:
            self.listening = self.hub.add(self.run_id, self._notified, statuses_only=self.statuses_only)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.hub is not None:
            self.hub.remove(self.run_id, self._notified)

    def _notified(self) -> None:
        self.event.set()
        if self.loop is not None and self.async_event is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed
                self.loop.call_soon_threadsafe(self.async_event.set)

    def pause_s(self, interval_s: float) -> float:
        if self.listening:
            return interval_s
        waited = time.monotonic() - self.started
        return min(interval_s, max(self.min_pause_s, waited / 10))

    def wait(self, interval_s: float) -> bool:
        if self.hub is not None and not self.listening:  # the hub may have (re)connected meanwhile
            self.listening = self.hub.ready.is_set()
        woke = self.event.wait(self.pause_s(interval_s))
        self.event.clear()
        return woke

    async def wait_async(self, interval_s: float) -> bool:
        if self.async_event is None:
            self.loop = asyncio.get_running_loop()
            self.async_event = asyncio.Event()
            if self.event.is_set():
                self.async_event.set()
        if self.hub is not None and not self.listening:
            self.listening = self.hub.ready.is_set()
        try:
            await asyncio.wait_for(self.async_event.wait(), timeout=self.pause_s(interval_s))
            woke = True
        except TimeoutError:
            woke = False
        self.async_event.clear()
        self.event.clear()
        return woke
