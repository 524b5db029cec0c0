"""Shadow runs through real workers: the caller's run finishes while its shadow has not even started (no worker
takes the shadow queue yet), so the caller never waits for it; then a worker of the shadow queue runs the shadow
and the pair is compared.

The tests share one platform (Redis, web server, the published candidate shadowing every live run, a worker of the
default queue): each starts its own worker of the shadow queue, killed after it, and leaves no run unfinished and
no message on the shadow queue (or the next test gets a new platform)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.e2e.harness import SharedBetweenTests, publish_with_twin_candidate, redis_server, wait_until
from tests.e2e.workers import Platform, platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


@dataclass
class Shadowing:
    platform: Platform
    broker_url: str
    candidate: str  # the version number the live runs are shadowed on


@contextlib.contextmanager
def shadowing_platform(workdir: Path) -> Iterator[Shadowing]:
    with (
        redis_server(workdir) as broker_url,
        platform_without_workers(workdir, broker_url=broker_url, env={"PLATFORM_SHADOW_QUEUE": "shadow"}) as p,
    ):
        candidate = publish_with_twin_candidate(p.manage)
        p.manage("agent_version", "shadow", "company-assistant", candidate, "--rate", "1")
        p.start_worker("live")  # the default queue only
        try:
            yield Shadowing(platform=p, broker_url=broker_url, candidate=candidate)
        finally:
            for worker in p.workers:  # nothing is asserted of their shutdown: killed, not stopped (seconds each)
                if worker.process.poll() is None:
                    worker.kill()


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedBetweenTests[Shadowing]]:
    shared = SharedBetweenTests(lambda: shadowing_platform(tmp_path_factory.mktemp("shadow")))
    yield shared
    shared.discard()


def left_over(shadowing: Shadowing) -> bool:
    """A run not finished, a message on the shadow queue, or the live worker gone: what the next test must not
    inherit."""
    p = shadowing.platform
    unfinished = p.query("SELECT COUNT(*) FROM agents_run WHERE status NOT IN ('succeeded', 'failed', 'cancelled')")
    on_the_shadow_queue = redis.Redis.from_url(shadowing.broker_url).llen("shadow")
    return unfinished[0][0] > 0 or on_the_shadow_queue > 0 or p.workers[0].process.poll() is not None


@pytest.fixture
def shadowing(shared_platform: SharedBetweenTests[Shadowing]) -> Iterator[Shadowing]:
    """The module's platform with its live worker only; the workers the test starts are killed after it."""
    shared = shared_platform.get()
    assert len(shared.platform.workers) == 1 and not left_over(shared)
    try:
        yield shared
    finally:
        for worker in shared.platform.workers[1:]:
            if worker.process.poll() is None:
                worker.kill()
        del shared.platform.workers[1:]
        if left_over(shared):
            shared_platform.discard()


def test_the_caller_never_waits_for_the_shadow_and_the_pair_is_compared(shadowing: Shadowing) -> None:
    p = shadowing.platform
    assert shadowing.candidate == "2"
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


def test_a_shadow_run_whose_message_was_lost_is_sent_again_to_the_shadow_queue(shadowing: Shadowing) -> None:
    """The broker lost the shadow's message (a Redis restart without persistence): the reconciler sends it again,
    to the shadow queue, so the live worker, which takes only the default queue, never runs it."""
    p = shadowing.platform
    with p.client() as client:
        run_id = client.post("/api/v1/runs", json={"agent": "company-assistant", "query": QUESTION}).json()["id"]
    wait_until(lambda: p.run_row(run_id)["status"] == "succeeded", timeout=60, what="the live run")
    # The live worker creates the shadow just after it stored the caller's outcome.
    shadow_of = ("SELECT id FROM agents_run WHERE shadow_of_id = ?", run_id.replace("-", ""))
    wait_until(lambda: len(p.query(*shadow_of)) == 1, timeout=30, what="the shadow run")
    [(shadow_id,)] = p.query(*shadow_of)
    broker = redis.Redis.from_url(shadowing.broker_url)
    wait_until(lambda: broker.llen("shadow") == 1, timeout=30, what="the shadow's message")
    broker.delete("shadow")

    # Queued for more than the 1 s the pass below counts as stale (by the database's clock, which it reads).
    older = "SELECT julianday('now') - julianday(created_at) > 1.2 / 86400 FROM agents_run WHERE id = ?"
    wait_until(lambda: p.query(older, shadow_id)[0][0] == 1, timeout=30, what="the shadow to be stale", interval=0.1)
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
