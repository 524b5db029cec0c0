"""End to end, as callers meet it: the API → a real Celery worker process → a deterministic rule → the real
demo MCP server over stdio → an audited answer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.e2e.harness import RunningPlatform, redis_server, running_platform, wait_until

pytestmark = pytest.mark.e2e


def ask_and_wait(platform: RunningPlatform, query: str) -> dict:
    with platform.client() as client:
        submitted = client.post("/api/v1/runs", json={"agent": "company-assistant", "query": query})
        assert submitted.status_code == 202, submitted.text
        run_id = submitted.json()["id"]
        finished: dict = {}

        def done() -> bool:
            finished.update(client.get(f"/api/v1/runs/{run_id}").json())
            return finished["status"] in {"succeeded", "failed"}

        wait_until(done, timeout=90, what=f"run {run_id} to finish", interval=0.3)
        return finished


def audit_rows(db_path: Path, run_id: str) -> list[tuple]:
    with sqlite3.connect(db_path) as db:
        return db.execute(
            "SELECT source, mcp_id, tool, ok, args FROM audit_auditevent WHERE run_id = ? AND action = 'tool.call' ORDER BY id",
            (run_id.replace("-", ""),),
        ).fetchall()


def check_the_seed_questions(platform: RunningPlatform) -> None:
    run = ask_and_wait(platform, "김하늘 님은 어느 팀 소속인가요?")
    assert run["status"] == "succeeded", run
    assert "클라우드운영팀" in run["answer"]
    assert [(c["source"], c["name"], c["ok"]) for c in run["tool_calls"]] == [
        ("deterministic", "search_employee", True)
    ]
    rows = audit_rows(platform.db_path, run["id"])
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("deterministic", "sds-company-data", "search_employee", 1)]
    assert "김하늘" in rows[0][4]

    run = ask_and_wait(platform, "클라우드운영팀 인원이 몇 명인지 알려주세요.")
    assert run["answer"] == "클라우드운영팀 인원은 3명입니다: 김하늘, 이서준, 정하은."


def test_a_query_travels_through_a_real_worker_on_the_embedded_broker(tmp_path: Path) -> None:
    with running_platform(tmp_path, as_an_operator=True) as platform:
        check_the_seed_questions(platform)


@pytest.mark.redis
def test_a_query_travels_through_a_real_worker_on_redis(tmp_path: Path) -> None:
    with redis_server(tmp_path) as broker_url, running_platform(tmp_path, broker_url=broker_url) as platform:
        check_the_seed_questions(platform)
