"""The probes' worker check wants a worker able to take live runs, not any worker: one consuming only the shadow
queue, or one on another broker (another Redis database), left ``/readyz`` at 200 and ``platform_workers_alive`` at 1
while a new run stayed queued. Rows written before the heartbeat named its queues and broker still count. With no
heartbeat the check no longer says that no worker runs (one cut off from its broker stops writing it); ``/metrics``
takes a lowercase ``bearer``; a database never migrated is named so, by ``/readyz``'s worker and audit checks.
Heartbeat rows as a worker writes them; the e2e test runs real workers on a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from agent_platform.probes import failure_reason
from agents.heartbeats import broker_identity, same_broker, this_broker, worker_heartbeat_record
from agents.models import WorkerHeartbeat
from tests.e2e.harness import _SETUP_VARIABLES, ROOT, redis_server, wait_until
from tests.e2e.workers import Platform, platform_without_workers
from tests.test_probes import scrape

NOT_MIGRATED = "database not migrated: run manage.py migrate"


def worker_check(client: Client) -> tuple[int, dict[str, Any]]:
    response = client.get("/readyz")
    return response.status_code, response.json()["checks"]["worker"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_of_the_shadow_queue_only_is_not_one_for_live_runs(client: Client) -> None:
    worker_heartbeat_record(worker="shadow@host:1", queues=["shadow"], broker=this_broker())

    status, check = worker_check(client)
    assert status == 503
    assert check["error"] == "1 worker has a recent heartbeat, none consumes the queue 'celery'"
    assert scrape(client)[("platform_workers_alive", ())] == 0

    worker_heartbeat_record(worker="live@host:2", queues=["celery", "shadow"], broker=this_broker())
    status, check = worker_check(client)
    assert status == 200 and check["ok"] is True
    assert scrape(client)[("platform_workers_alive", ())] == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_another_broker_is_not_one_for_live_runs(client: Client) -> None:
    other = broker_identity("redis://:secret-password@127.0.0.1:6379/5")
    assert other == "redis://127.0.0.1:6379/5" and other != this_broker()
    worker_heartbeat_record(worker="a@host:1", queues=["celery"], broker=other)
    worker_heartbeat_record(worker="b@host:2", queues=["celery"], broker=other)

    status, check = worker_check(client)
    assert status == 503
    assert check["error"] == "2 workers have a recent heartbeat, none on this broker"
    assert scrape(client)[("platform_workers_alive", ())] == 0

    # One on this broker, of another queue: neither takes live runs.
    worker_heartbeat_record(worker="c@host:3", queues=["shadow"], broker=this_broker())
    assert worker_check(client)[1]["error"] == (
        "3 workers have a recent heartbeat, none consumes the queue 'celery' on this broker"
    )


def test_one_broker_spelt_two_ways_is_one_broker() -> None:
    """A web and a worker may name the broker's host differently (``localhost``, ``127.0.0.1``; a DNS name and its
    address): compared as text, a healthy install was never ready."""
    assert same_broker(broker_identity("redis://localhost:6379/0"), broker_identity("redis://127.0.0.1"))
    assert same_broker(
        broker_identity("sentinel://h1:26379;sentinel://h2:26379"), broker_identity("sentinel://h2:26379")
    )
    assert not same_broker(broker_identity("redis://localhost/0"), broker_identity("redis://127.0.0.1/5"))
    assert not same_broker(broker_identity("rediss://localhost/0"), broker_identity("redis://127.0.0.1/0"))
    assert not same_broker(broker_identity("redis://a.invalid/0"), broker_identity("redis://b.invalid/0"))


@pytest.mark.django_db(transaction=True)
def test_a_worker_naming_the_webs_broker_by_its_address_takes_live_runs(client: Client, settings: Any) -> None:
    from celery import current_app

    web = current_app.conf.broker_url
    current_app.conf.broker_url = "redis://localhost:6379/0"
    try:
        worker_heartbeat_record(worker="w@host:1", queues=["celery"], broker=broker_identity("redis://127.0.0.1:6379"))
        status, check = worker_check(client)
        assert status == 200 and check["ok"] is True
    finally:
        current_app.conf.broker_url = web


@pytest.mark.django_db(transaction=True)
def test_a_row_written_before_the_heartbeat_named_queue_and_broker_still_counts(client: Client) -> None:
    WorkerHeartbeat.objects.create(worker="old@host:1", seen_at=timezone.now())  # as the rows of an upgrade are

    assert worker_check(client)[0] == 200
    assert scrape(client)[("platform_workers_alive", ())] == 1


def test_broker_identity_names_the_broker_never_its_password() -> None:
    assert broker_identity("redis://:pw@Redis.example:6379") == "redis://redis.example:6379/0"
    assert broker_identity("redis://user:pw@redis.example/0") == "redis://redis.example:6379/0"
    assert broker_identity("amqp://guest:guest@mq:5672/vhost") == "amqp://mq:5672/vhost"
    assert broker_identity("filesystem://", {"data_folder_in": "/srv/a/broker/queue"}) == (
        "filesystem:///srv/a/broker/queue"
    )
    assert "pw" not in broker_identity("sentinel://:pw@s1:26379;sentinel://:pw@s2:26379")


@pytest.mark.django_db(transaction=True)
def test_no_heartbeat_does_not_say_that_no_worker_runs(client: Client, settings: Any) -> None:
    settings.PLATFORM_READY_WORKER_MAX_AGE_S = 60
    status, check = worker_check(client)
    assert status == 503
    assert check["error"] == (
        "no worker has written a heartbeat within 60 s (a worker cut off from its broker or database stops writing one)"
    )

    worker_heartbeat_record(worker="old@host:1", now=timezone.now() - timedelta(minutes=5))
    assert worker_check(client)[1]["error"].endswith("; the last one was written 300 s ago")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_metrics_takes_the_bearer_scheme_in_any_case(client: Client, settings: Any, scheme: str) -> None:
    settings.PLATFORM_METRICS_TOKEN = "scrape-token-0123456789"
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = []
    sent = f"{scheme} scrape-token-0123456789"
    assert client.get("/metrics", HTTP_AUTHORIZATION=sent).status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"{scheme}\tscrape-token-0123456789").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"{scheme} wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic scrape-token-0123456789").status_code == 403


def test_a_missing_table_or_column_is_named_not_migrated() -> None:
    from django.db import OperationalError, ProgrammingError

    assert failure_reason(OperationalError("no such table: agents_workerheartbeat")) == NOT_MIGRATED
    assert failure_reason(OperationalError("no such column: agents_workerheartbeat.queues")) == NOT_MIGRATED
    assert failure_reason(ProgrammingError('relation "agents_workerheartbeat" does not exist')) == NOT_MIGRATED
    assert failure_reason(ProgrammingError("column agents_workerheartbeat.queues does not exist")) == NOT_MIGRATED
    assert failure_reason(OperationalError('database "platform" does not exist')) != NOT_MIGRATED


READYZ_OF_A_FRESH_DATABASE = """
import json, django
django.setup()
from django.test import Client
response = Client().get("/readyz")
print(json.dumps([response.status_code, response.json()["checks"]]))
"""


@pytest.mark.slow
def test_readyz_of_a_database_never_migrated_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)}
    env.update(PLATFORM_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="agent_platform.settings")
    done = subprocess.run(
        [sys.executable, "-c", READYZ_OF_A_FRESH_DATABASE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status, checks = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 503
    assert checks["database"]["ok"] is True
    assert checks["worker"]["error"] == NOT_MIGRATED
    assert checks["audit"]["ok"] is False
    assert "the audit tables are missing (" in checks["audit"]["error"]
    assert checks["audit"]["error"].endswith("): run manage.py migrate")


def live_workers(platform: Platform) -> float:
    for line in httpx.get(f"{platform.base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("platform_workers_alive "):
            return float(line.split()[1])
    raise AssertionError("no platform_workers_alive in /metrics")


def readyz_worker(platform: Platform) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{platform.base_url}/readyz", timeout=30)
    return response.status_code, response.json()["checks"]["worker"]


@pytest.mark.e2e
@pytest.mark.slow
def test_real_workers_of_the_shadow_queue_or_another_redis_database_leave_the_platform_unready(
    tmp_path: Path,
) -> None:
    with (
        redis_server(tmp_path) as redis_url,
        platform_without_workers(
            tmp_path,
            broker_url=redis_url,
            # No run here: the workers' pool processes need not start the demo MCP server as they start.
            env={
                "PLATFORM_WORKER_HEARTBEAT_S": "1",
                "PLATFORM_SHADOW_QUEUE": "shadow",
                "PLATFORM_MCP_OPEN_AT_START": "0",
            },
        ) as p,
    ):
        p.start_worker("shadow", queues="shadow")
        wait_until(
            lambda: p.query("SELECT queues FROM agents_workerheartbeat") == [("shadow",)],
            timeout=30,
            what="its heartbeat",
        )
        assert readyz_worker(p)[0] == 503
        assert readyz_worker(p)[1]["error"] == "1 worker has a recent heartbeat, none consumes the queue 'celery'"
        assert live_workers(p) == 0

        elsewhere = redis_url.rsplit("/", 1)[0] + "/5"
        p.start_worker("elsewhere", env={"CELERY_BROKER_URL": elsewhere})
        wait_until(
            lambda: len(p.query("SELECT worker FROM agents_workerheartbeat")) == 2, timeout=30, what="its heartbeat"
        )
        (broker,) = p.query("SELECT broker FROM agents_workerheartbeat WHERE queues = 'celery'")[0]
        assert broker.endswith("/5")
        assert readyz_worker(p)[1]["error"] == (
            "2 workers have a recent heartbeat, none consumes the queue 'celery' on this broker"
        )
        assert live_workers(p) == 0

        p.start_worker("live")
        wait_until(lambda: readyz_worker(p)[0] == 200, timeout=30, what="a worker of the live runs' queue")
        assert live_workers(p) == 1
