"""A run whose configuration holds a secret the worker cannot decrypt, on a real Celery worker and Redis: the
demo agent's model secrets replaced, by SQL, with a token made under another key (a dump restored from another
installation, a key dropped at rotation) after the run was queued. The worker fails the run on its first delivery
with the reason; it is not delivered again nor taken for lost by the reconciler. (Leases are 3 s and the reconciler
runs every second: a run left ``running`` would be queued again within seconds.) The API's 503 for such a
configuration: ``tests/agents/test_poisoned_runs.py``."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.e2e.harness import redis_server, wait_until, workers_killed_at_exit
from tests.e2e.workers import platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

FAST_LIFECYCLE = {"PLATFORM_RUN_LEASE_S": "3", "PLATFORM_RECONCILE_INTERVAL_S": "1"}
QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def foreign_token(value: object) -> str:
    return "fernet:" + Fernet(Fernet.generate_key()).encrypt(json.dumps(value).encode()).decode()


def test_a_run_whose_agents_secret_cannot_be_decrypted_fails_once_with_its_reason(tmp_path: Path) -> None:
    with (
        redis_server(tmp_path) as broker_url,
        platform_without_workers(tmp_path, broker_url=broker_url, env=FAST_LIFECYCLE) as platform,
        workers_killed_at_exit(platform),
    ):
        with platform.client() as client:
            response = client.post("/api/v1/runs", json={"agent": "company-assistant", "query": QUESTION})
        assert response.status_code == 202, response.text
        run_id = str(response.json()["id"])
        with contextlib.closing(sqlite3.connect(platform.db_path, timeout=30)) as db, db:
            db.execute(
                "UPDATE agents_agent SET model_secrets = ? WHERE slug = 'company-assistant'",
                (foreign_token({"api_key": {"value": "sk-foreign-000000000000"}}),),
            )

        worker = platform.start_worker("only")
        wait_until(
            lambda: platform.run_row(run_id)["status"] in {"succeeded", "failed"}, timeout=60, what="the run's end"
        )
        row = platform.run_row(run_id)
        assert (row["status"], row["error_code"], row["delivery_count"]) == ("failed", "config:secret_unreadable", 1)
        assert "SECRETS_ENCRYPTION_KEYS" in row["error_message"]
        assert [e["status"] for e in platform.run_events(run_id, "status")] == ["failed"]
        # The task ended (no retry, no redelivery); a reconciler pass finds nothing to do with the run.
        wait_until(lambda: "succeeded in" in worker.log.read_text(errors="replace"), timeout=30, what="the task")
        log = worker.log.read_text(errors="replace")
        assert "raised unexpected" not in log and "sk-foreign" not in log
        platform.manage("reconcile_runs")
        row = platform.run_row(run_id)
        assert (row["status"], row["error_code"], row["delivery_count"]) == ("failed", "config:secret_unreadable", 1)
