"""Shadow runs through real workers: the caller's run finishes while its shadow has not even started (no worker
takes the shadow queue yet), so the caller never waits for it; then a worker of the shadow queue runs the shadow
and the pair is compared."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.harness import publish_with_twin_candidate, redis_server, wait_until
from tests.e2e.workers import platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def test_the_caller_never_waits_for_the_shadow_and_the_pair_is_compared(tmp_path: Path) -> None:
    with (
        redis_server(tmp_path) as broker_url,
        platform_without_workers(tmp_path, broker_url=broker_url, env={"PLATFORM_SHADOW_QUEUE": "shadow"}) as p,
    ):
        candidate = publish_with_twin_candidate(p.manage)
        assert candidate == "2"
        p.manage("agent_version", "shadow", "company-assistant", candidate, "--rate", "1")
        p.start_worker("live")
        with p.client() as client:
            run_id = client.post("/api/v1/runs", json={"agent": "company-assistant", "query": QUESTION}).json()["id"]
            deadline = time.monotonic() + 60
            body = client.get(f"/api/v1/runs/{run_id}").json()
            while body["status"] not in {"succeeded", "failed"} and time.monotonic() < deadline:
                time.sleep(0.1)
                body = client.get(f"/api/v1/runs/{run_id}").json()
        assert (body["status"], body["version"]) == ("succeeded", 1)
        assert body["answer"].startswith("A-1001:")
        # The caller has the answer; the shadow (created just after it) is queued and nobody has taken it.
        wait_until(
            lambda: bool(p.query("SELECT 1 FROM agents_run WHERE shadow_of_id = ?", run_id.replace("-", ""))),
            timeout=30,
            what="the shadow run",
        )
        [(shadow_id, status, purpose)] = p.query(
            "SELECT id, status, purpose FROM agents_run WHERE shadow_of_id = ?", run_id.replace("-", "")
        )
        assert (status, purpose) == ("queued", "shadow")

        p.start_worker("shadow", queues="shadow")
        wait_until(
            lambda: p.query("SELECT status FROM agents_run WHERE id = ?", shadow_id)[0][0] == "succeeded",
            timeout=90,
            what="the shadow run",
        )
        wait_until(
            lambda: bool(p.query("SELECT agrees FROM agents_shadowcomparison WHERE shadow_run_id = ?", shadow_id)),
            timeout=30,
            what="the comparison",
        )
        [(agrees, same_tools)] = p.query(
            "SELECT agrees, same_tools FROM agents_shadowcomparison WHERE shadow_run_id = ?", shadow_id
        )
        assert (agrees, same_tools) == (1, 1)
        sources = {s for (s,) in p.query("SELECT source FROM audit_auditevent WHERE run_id = ?", shadow_id)}
        assert sources == {"shadow"}
        # The caller's answer is what it was.
        assert p.run_row(run_id)["answer"] == body["answer"]


def test_a_shadow_run_whose_message_was_lost_is_sent_again_to_the_shadow_queue(tmp_path: Path) -> None:
    """The broker lost the shadow's message (a Redis restart without persistence): the reconciler sends it again,
    to the shadow queue, so the live worker, which takes only the default queue, never runs it."""
    import redis

    with (
        redis_server(tmp_path) as broker_url,
        platform_without_workers(tmp_path, broker_url=broker_url, env={"PLATFORM_SHADOW_QUEUE": "shadow"}) as p,
    ):
        candidate = publish_with_twin_candidate(p.manage)
        p.manage("agent_version", "shadow", "company-assistant", candidate, "--rate", "1")
        p.start_worker("live")
        with p.client() as client:
            run_id = client.post("/api/v1/runs", json={"agent": "company-assistant", "query": QUESTION}).json()["id"]
        wait_until(lambda: p.run_row(run_id)["status"] == "succeeded", timeout=60, what="the live run")
        # The live worker creates the shadow just after it stored the caller's outcome.
        shadow_of = ("SELECT id FROM agents_run WHERE shadow_of_id = ?", run_id.replace("-", ""))
        wait_until(lambda: len(p.query(*shadow_of)) == 1, timeout=30, what="the shadow run")
        [(shadow_id,)] = p.query(*shadow_of)
        broker = redis.Redis.from_url(broker_url)
        wait_until(lambda: broker.llen("shadow") == 1, timeout=30, what="the shadow's message")
        broker.delete("shadow")

        time.sleep(1.5)
        report = p.manage("reconcile_runs", env={"PLATFORM_RUN_QUEUED_STALE_S": "1"})
        assert "redispatched: 1" in report
        assert broker.llen("shadow") == 1
        time.sleep(3)  # the live worker is idle and consumes the default queue: it must not take the shadow
        assert p.query("SELECT status FROM agents_run WHERE id = ?", shadow_id)[0][0] == "queued"

        p.start_worker("shadow", queues="shadow")
        wait_until(
            lambda: p.query("SELECT status FROM agents_run WHERE id = ?", shadow_id)[0][0] == "succeeded",
            timeout=90,
            what="the shadow run",
        )
        assert p.query("SELECT purpose FROM agents_run WHERE id = ?", shadow_id)[0][0] == "shadow"
