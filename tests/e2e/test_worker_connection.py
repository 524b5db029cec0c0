"""A worker process keeps one database connection across runs (``agent_platform.celery``): on PostgreSQL a new
connection per run cost more than the run's own queries. Counted by PostgreSQL itself (``pg_stat_database``'s
``sessions``, every connection ever opened to the database) around runs submitted with ``?wait``: each run then
costs the web process's request one connection, and the worker none."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.e2e.harness import workers_killed_at_exit
from tests.e2e.workers import Platform, platform_without_workers
from tests.postgres import private_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.slow]

# Three runs tell the two apart: a worker that opened a connection per run would add three to the requests' three
# (and our count's one), over the bound of four; the worker told to open one per run opens two per run (six).
RUNS = 3


def sessions(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as db:
        row = db.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def _connections_for_runs(platform: Platform, database_url: str) -> int:
    with platform.client(timeout=120) as client:
        warm = client.post("/api/v1/runs?wait=60", json={"agent": "company-assistant", "query": "김하늘 님 팀?"})
        assert warm.json()["status"] == "succeeded", warm.text
        before = sessions(database_url)
        for _ in range(RUNS):
            done = client.post(
                "/api/v1/runs?wait=60", json={"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}
            )
            assert done.json()["status"] == "succeeded", done.text
        return sessions(database_url) - before


def test_a_worker_runs_many_runs_on_one_database_connection(tmp_path: Path) -> None:
    # No timers in the worker (the reconciler, the audit anchor and chainer, the heartbeat, the eval refresh): each
    # pass of a timer opens a connection of its own (a connection must not cross the pool's forks).
    quiet = {
        "PLATFORM_RECONCILE_IN_WORKER": "0",
        "AUDIT_ANCHOR_INTERVAL_S": "0",
        "AUDIT_CHAIN_INTERVAL_S": "0",
        "PLATFORM_WORKER_HEARTBEAT_S": "0",
        "PLATFORM_EVAL_REFRESH_S": "0",
    }
    with (
        private_postgres() as database_url,
        platform_without_workers(tmp_path, broker_url="filesystem://", database_url=database_url) as platform,
        workers_killed_at_exit(platform),
    ):
        # The contrast: a worker told to open a connection per run (as every worker did before).
        per_run = platform.start_worker("per-run", env={**quiet, "PLATFORM_WORKER_DB_CONN_MAX_AGE": "0"})
        opened_per_run = _connections_for_runs(platform, database_url)
        per_run.kill()  # nothing is asserted of its shutdown (a warm one takes seconds)
        platform.start_worker("kept", env=quiet)
        opened_kept = _connections_for_runs(platform, database_url)
    # One per request (the web process's connections live for a request), one for our own count; the worker none.
    assert opened_kept <= RUNS + 1, f"{opened_kept} connections for {RUNS} runs"
    assert opened_per_run >= 2 * RUNS, f"{opened_per_run} connections for {RUNS} runs"
