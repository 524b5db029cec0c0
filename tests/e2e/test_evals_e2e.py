"""``run_eval`` as an operator (or a CI job) runs it: a separate process, the cases executed by a real Celery
worker over Redis, the exit status gating a deploy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import ROOT, redis_server, wait_until
from tests.e2e.workers import platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

SEED_SET = ROOT / "evals" / "fixtures" / "seed_001_tool_questions.json"


def test_run_eval_runs_the_cases_on_a_worker_and_exits_non_zero_below_the_thresholds(tmp_path: Path) -> None:
    with redis_server(tmp_path) as broker_url, platform_without_workers(tmp_path, broker_url=broker_url) as platform:
        platform.start_worker("w1")
        platform.manage("import_config", str(SEED_SET))

        def run_eval(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "manage.py", "run_eval", "company-assistant", "seed-001-tools", *args],
                cwd=ROOT,
                env=platform.env,
                capture_output=True,
                text=True,
                timeout=300,
            )

        passed = run_eval("--workers", "2", "--json")
        assert passed.returncode == 0, passed.stdout + passed.stderr
        body = json.loads(passed.stdout)
        assert body["summary"]["passed"] == 4 and body["failed_thresholds"] == []
        assert "5/5 cases" in passed.stderr
        # Every case ran on the worker as an eval run; its calls are audited as eval, not as live traffic.
        assert platform.query("SELECT DISTINCT purpose FROM agents_run") == [("eval",)]
        assert platform.query("SELECT DISTINCT worker != '' FROM agents_run") == [(1,)]
        sources = platform.query("SELECT DISTINCT source FROM audit_auditevent WHERE action = 'tool.call'")
        assert sources == [("eval",)]

        document = json.loads(SEED_SET.read_text(encoding="utf-8"))
        document["eval_sets"][0]["thresholds"] = {"pass_rate": 1.0}
        platform.import_config(document)
        failed = run_eval()
        assert failed.returncode == 1
        assert "pass_rate 0.8 < 1.0" in failed.stderr


def test_an_eval_started_through_the_api_finishes_on_the_workers_without_anyone_reading_it(tmp_path: Path) -> None:
    with (
        redis_server(tmp_path) as broker_url,
        platform_without_workers(tmp_path, broker_url=broker_url, env={"PLATFORM_EVAL_REFRESH_S": "0.5"}) as platform,
    ):
        platform.start_worker("w1", concurrency=2)
        platform.manage("import_config", str(SEED_SET))
        admin_key = platform.manage("create_api_key", "ops", "--admin").strip().splitlines()[-1]
        with httpx.Client(base_url=platform.base_url, headers={"Authorization": f"Bearer {admin_key}"}) as client:
            started = client.post("/api/v1/evals/runs", json={"set": "seed-001-tools"}, timeout=60)
        assert started.status_code == 202, started.text
        eval_run_id = started.json()["id"].replace("-", "")

        # Nobody loads the eval run's page or its API: the workers' background pass scores and finishes it.
        def finished() -> bool:
            return platform.query("SELECT status FROM evals_evalrun WHERE id = ?", eval_run_id) == [("finished",)]

        wait_until(finished, timeout=180, what="the eval run to finish in the background")
        [(done, total, summary)] = platform.query(
            "SELECT done, total, summary FROM evals_evalrun WHERE id = ?", eval_run_id
        )
        assert (done, total) == (5, 5)
        assert json.loads(summary)["passed"] == 4
        assert platform.query(
            "SELECT COUNT(*) FROM evals_evalcaseresult WHERE eval_run_id = ? AND scored", eval_run_id
        ) == [(5,)]
