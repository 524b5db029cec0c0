"""A run's waiters (``?wait``, the event stream, the admin's live view) are woken by the run's change: a Redis
message or a PostgreSQL notification sent when the change commits, else a short adaptive poll
(``agents.run_wakeup``). The waiters here wait with a long interval, so that only a notification can wake them
in time: a waiter that fell back on its poll would report ``False`` (or run past the test's limit)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from agents.models import Agent, Run
from agents.run_state import RunEventWriter
from agents.run_wakeup import RunWatch, WakeHub, wake_hub, wakeup_kind
from agents.selectors import run_wait
from tests.e2e.harness import redis_server
from tests.postgres import REPO, platform_env, postgres_url  # noqa: F401

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = pytest.mark.slow

LONG_S = 60.0  # a waiter's interval: far longer than any test below may take


class Waiter(threading.Thread):
    """Waits once, on a thread of its own, and records whether a notification woke it."""

    def __init__(self, watch: RunWatch, interval_s: float = LONG_S) -> None:
        super().__init__(daemon=True)
        self.watch = watch
        self.interval_s = interval_s
        self.woke: bool | None = None

    def run(self) -> None:
        self.woke = self.watch.wait(self.interval_s)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url, override_settings(REDIS_URL=url, PLATFORM_RUN_WAKEUP="auto"):
        yield url
        hub = wake_hub()
        if hub is not None:
            hub.close()


@pytest.fixture
def run(demo_agent: Agent) -> Run:
    return Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")


def _finish(run: Run) -> None:
    """What a worker does at the end of a run: its status event and its status, in one transaction."""
    with transaction.atomic():
        RunEventWriter(run_id=run.pk, secrets=[]).emit("status", {"status": "succeeded", "answer": "데이터팀"})
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, answer="데이터팀", finished_at=timezone.now())


def test_without_redis_or_postgresql_waiters_poll_briefly_at_first_then_less_often(settings: Any) -> None:
    settings.REDIS_URL = ""
    settings.CELERY_BROKER_URL = "filesystem://"
    assert wakeup_kind() == "poll"
    assert wake_hub() is None
    with RunWatch("any") as watch:
        assert watch.pause_s(1.0) == pytest.approx(0.005)
        watch.started -= 3.0  # three seconds into the wait
        assert watch.pause_s(1.0) == pytest.approx(0.3, abs=0.01)
        assert watch.pause_s(0.1) == 0.1  # never longer than the caller's interval


def test_redis_or_postgresql_is_chosen_where_the_platform_has_it(settings: Any) -> None:
    settings.REDIS_URL = ""
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    assert wakeup_kind() == "redis"
    settings.PLATFORM_RUN_WAKEUP = "poll"
    assert wakeup_kind() == "poll"


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_waiter_is_woken_by_the_redis_message_of_its_runs_committed_event(redis_url: str, run: Run) -> None:
    assert wakeup_kind() == "redis"
    with RunWatch(run.pk) as watch:
        assert watch.listening
        waiter = Waiter(watch)
        waiter.start()
        _finish(run)
        waiter.join(timeout=30)
    assert waiter.woke is True


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_no_message_for_a_rolled_back_change_or_another_run(redis_url: str, run: Run, demo_agent: Agent) -> None:
    other = Run.objects.create(agent=demo_agent, query="other")
    with RunWatch(run.pk) as watch:
        assert watch.listening
        with transaction.atomic():
            RunEventWriter(run_id=run.pk, secrets=[]).emit("status", {"status": "running"})
            transaction.set_rollback(True)
        RunEventWriter(run_id=other.pk, secrets=[]).emit("status", {"status": "running"})
        assert watch.wait(0.5) is False
        RunEventWriter(run_id=run.pk, secrets=[]).emit("status", {"status": "running"})  # the probe: this one wakes it
        assert watch.wait(LONG_S) is True


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_events_that_leave_the_status_wake_the_stream_but_not_a_status_waiter(redis_url: str, run: Run) -> None:
    """The run's start (``running``), a rule decision, a tool result, a model turn: the event stream is woken,
    ``?wait`` (statuses only) is not, so a run's intermediate events cost its ``?wait`` caller no read; a status
    that ends a wait wakes both."""
    with RunWatch(run.pk) as stream, RunWatch(run.pk, statuses_only=True) as status_waiter:
        assert stream.listening and status_waiter.listening
        writer = RunEventWriter(run_id=run.pk, secrets=[])
        writer.emit("status", {"status": "running", "delivery": 1})
        assert stream.wait(LONG_S) is True
        assert status_waiter.wait(0.5) is False
        writer.emit("rule", {"rule": "직원 소속 조회", "matched": True})
        assert stream.wait(LONG_S) is True
        assert status_waiter.wait(0.5) is False
        writer.emit_many([("deterministic_result", {"tool": "search_employee"}), ("model_turn", {"content": "…"})])
        assert stream.wait(LONG_S) is True
        assert status_waiter.wait(0.5) is False
        writer.emit_many([("model_turn", {"content": "김하늘"}), ("status", {"status": "succeeded"})])
        assert status_waiter.wait(LONG_S) is True
        assert stream.wait(LONG_S) is True


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_wait_returns_the_finished_run_when_it_is_told_not_at_its_interval(redis_url: str, run: Run) -> None:
    threading.Timer(0.3, _finish, args=[run]).start()
    started = time.monotonic()
    waited = run_wait(run=run, timeout_s=LONG_S, interval_s=LONG_S)
    assert waited.status == Run.Status.SUCCEEDED
    assert time.monotonic() - started < LONG_S / 2


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_an_async_waiter_the_event_stream_is_woken_too(redis_url: str, run: Run) -> None:
    async def wait() -> bool:
        watch = RunWatch(run.pk)
        await asyncio.to_thread(watch.__enter__)
        try:
            waiting = asyncio.ensure_future(watch.wait_async(LONG_S))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(_finish, run)
            return await asyncio.wait_for(waiting, timeout=30)
        finally:
            watch.__exit__()

    assert asyncio.run(wait()) is True


@pytest.mark.postgres
@pytest.mark.slow
def test_on_postgresql_a_waiter_is_woken_by_the_notify_sent_at_commit(postgres_url: str) -> None:  # noqa: F811
    """The platform's own process (on PostgreSQL, without Redis) changes the run in a transaction that stays open
    for a while after ``run_changed``: the waiter is woken once it commits, not before."""
    run_id = "4b1c2d3e-0000-4000-8000-000000000001"
    script = (
        "import sys, time\n"
        "from django.db import transaction\n"
        "from agents.run_wakeup import run_changed, wakeup_kind\n"
        "assert wakeup_kind() == 'postgres', wakeup_kind()\n"
        "with transaction.atomic():\n"
        f"    run_changed(run_id='{run_id}')\n"
        "    print('sent', flush=True)\n"
        "    sys.stdin.readline()\n"
        "print('committed', flush=True)\n"
    )
    hub = WakeHub("postgres", postgres_url)
    try:
        with RunWatch(run_id, hub=hub) as watch:
            assert watch.listening
            waiter = Waiter(watch)
            waiter.start()
            env = {**platform_env(database_url=postgres_url), "REDIS_URL": "", "CELERY_BROKER_URL": ""}
            writer = subprocess.Popen(
                [sys.executable, "manage.py", "shell", "--no-imports", "-c", script],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert writer.stdout is not None and writer.stdin is not None
            assert writer.stdout.readline().strip() == "sent"
            waiter.join(timeout=1.0)
            assert waiter.is_alive()  # the transaction is still open: nothing was delivered yet
            writer.stdin.write("\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "committed"
            waiter.join(timeout=30)
            assert waiter.woke is True
            writer.wait(timeout=30)
    finally:
        hub.close()


@pytest.mark.django_db(transaction=True)
def test_with_the_listener_down_a_waiter_still_gets_the_run_by_reading_it_again(settings: Any, run: Run) -> None:
    from tests.postgres import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    try:
        with RunWatch(run.pk) as watch:
            assert not watch.listening
        threading.Timer(0.3, _finish, args=[run]).start()  # its notification is lost: Redis is not there
        assert run_wait(run=run, timeout_s=LONG_S, interval_s=0.1).status == Run.Status.SUCCEEDED
    finally:
        hub = wake_hub()
        if hub is not None:
            hub.close()


@pytest.mark.redis
def test_event_wake_ups_piled_up_go_out_once_each_in_order(redis_url: str) -> None:
    """The events' wake-ups leave the writer's path: what piled up goes out in one pipeline, each message once."""
    import redis

    from agents.run_wakeup import REDIS_CHANNEL, _EventPublisher

    listener = redis.Redis.from_url(redis_url).pubsub()
    listener.subscribe(REDIS_CHANNEL)
    assert listener.get_message(timeout=LONG_S)["type"] == "subscribe"
    batch = [(redis_url, f"{run}:event") for run in ("a", "b", "a", "a", "c", "b")]
    _EventPublisher.publish(batch)
    received = []
    while (message := listener.get_message(timeout=0.5)) is not None:
        received.append(message["data"].decode())
    assert received == ["a:event", "b:event", "c:event"]
    listener.close()


@pytest.mark.redis
def test_event_wake_ups_gather_for_a_while_after_the_first_then_go_out_together(redis_url: str, settings: Any) -> None:
    """A run's intermediate events (its start, rule decisions, tool result, model turn) come a few milliseconds
    apart: their wake-ups wait ``PLATFORM_RUN_EVENT_WAKEUP_GATHER_S`` after the first and go out in one pipeline,
    each run's once; with 0, the first goes out alone at once."""
    import redis

    from agents.run_wakeup import REDIS_CHANNEL, _EventPublisher

    listener = redis.Redis.from_url(redis_url).pubsub()
    listener.subscribe(REDIS_CHANNEL)
    assert listener.get_message(timeout=LONG_S)["type"] == "subscribe"

    def pipelines_for(messages: list[str]) -> list[list[str]]:
        sent: list[list[str]] = []
        publisher = _EventPublisher()
        publish = _EventPublisher.publish
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                _EventPublisher,
                "publish",
                staticmethod(lambda batch: (sent.append([m for _, m in batch]), publish(batch))),
            )
            for message in messages:
                publisher.put(redis_url, message)
                time.sleep(0.02)  # the next event of the run, 20 ms later
            deadline = time.monotonic() + LONG_S
            while sum(len(batch) for batch in sent) < len(messages) and time.monotonic() < deadline:
                time.sleep(0.01)
        return sent

    settings.PLATFORM_RUN_EVENT_WAKEUP_GATHER_S = 0.5
    sent = pipelines_for(["a:event", "a:event", "b:event", "a:event"])
    assert sent == [["a:event", "a:event", "b:event", "a:event"]]  # one pipeline
    received = []
    while (message := listener.get_message(timeout=0.5)) is not None:
        received.append(message["data"].decode())
    assert received == ["a:event", "b:event"]  # each run's once

    settings.PLATFORM_RUN_EVENT_WAKEUP_GATHER_S = 0
    sent = pipelines_for(["c:event", "c:event"])
    assert sent[0] == ["c:event"] and len(sent) == 2
    listener.close()


# ---- a setting the setup cannot have ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_postgres_wakeups_asked_for_on_sqlite_poll_and_do_not_break_a_runs_event_writes(
    settings, demo_agent, api_caller
) -> None:
    from agents.checks import check_run_wakeup
    from agents.models import Run, RunEvent
    from agents.run_state import RunEventWriter
    from agents.run_wakeup import wakeup_kind

    settings.PLATFORM_RUN_WAKEUP = "postgres"
    run = Run.objects.create(agent=demo_agent, api_key=api_caller[0], query="q")
    RunEventWriter(run_id=run.pk, secrets=[]).emit("status", {"status": "running"})  # pg_notify on SQLite raised
    assert RunEvent.objects.filter(run=run).count() == 1
    assert wakeup_kind() == "poll"
    assert [m.id for m in check_run_wakeup()] == ["agents.E004"]


@pytest.mark.parametrize("value", ["redis", "Redis", "none"])
def test_a_wakeup_setting_that_cannot_be_had_is_an_error_at_start_up(settings, value) -> None:
    from agents.checks import check_run_wakeup
    from agents.run_wakeup import wakeup_kind

    settings.PLATFORM_RUN_WAKEUP = value
    settings.REDIS_URL = ""
    settings.CELERY_BROKER_URL = "filesystem://"
    [message] = check_run_wakeup()
    assert message.id == "agents.E004" and value in message.msg
    assert wakeup_kind() == "poll"


def test_the_listening_connection_keeps_the_databases_tls_options(settings) -> None:
    from agents.run_wakeup import _postgres_params

    settings.DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "db",
            "USER": "u",
            "PASSWORD": "p",
            "HOST": "h",
            "PORT": 5432,
            "OPTIONS": {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem", "isolation_level": 1, "pool": True},
        }
    }
    params = _postgres_params()
    assert (params["sslmode"], params["sslrootcert"], params["dbname"], params["host"]) == (
        "verify-full",
        "/etc/ca.pem",
        "db",
        "h",
    )
    assert "isolation_level" not in params and "pool" not in params  # Django's, refused by psycopg.connect
