"""Runs survive their workers: real Celery workers on a private Redis, killed with SIGKILL while a run's tool
call is under way. Leases are 3 s and the workers' reconciler runs every second, so a lost run is noticed
within seconds.

The run: a scripted model calls the probe server's ``echo`` (a quick read call that also opens the MCP
session), then its ``sleep`` for 5 s (longer than a lease, so that a run that completes was kept by its
heartbeat), then answers. A worker is killed one second after the model asked for ``sleep``, i.e. while the tool
sleeps.

The three tests share one platform (Redis, web server, the probe's configuration): each starts its own workers,
which are killed after it, so that none takes or reconciles another test's run.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, SharedBetweenTests, redis_server, wait_until
from tests.e2e.workers import Platform, platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

# Longer than a lease (3 s) with room to spare: without its heartbeat the run would be taken over mid-sleep.
SLEEP_S = 5.0
FAST_LIFECYCLE = {
    "PLATFORM_RUN_LEASE_S": "3",
    "PLATFORM_RECONCILE_INTERVAL_S": "1",
}
SLEEPER = {
    "servers": [
        {
            "mcp_id": "probe",
            "transport": "stdio",
            "command": sys.executable,
            "args": ["-m", "tests.mcp_fixtures.probe_server"],
            "cwd": str(ROOT),
            "session_scope": "per_run",
            "timeout_s": 60,
        }
    ],
    # The admin who binds the probe confirms that its two tools only read (discovery proposes write).
    "contracts": [
        {"mcp_id": "probe", "tool": "echo", "args": {"text": {"type": "str", "required": True}}, "risk": "read"},
        {"mcp_id": "probe", "tool": "sleep", "args": {"seconds": {"type": "float", "required": True}}, "risk": "read"},
    ],
    "agents": [
        {
            "slug": "sleeper",
            "servers": ["probe"],
            "model": {
                "provider": "scripted",
                "params": {
                    "script": [
                        {"tool_calls": [{"name": "echo", "args": {"text": "warm"}, "id": "call_echo"}]},
                        {"tool_calls": [{"name": "sleep", "args": {"seconds": SLEEP_S}, "id": "call_sleep"}]},
                        {"content": "done: {last_tool_result}"},
                    ]
                },
            },
        }
    ],
}


@contextlib.contextmanager
def sleeper_platform(workdir: Path) -> Iterator[Platform]:
    with (
        redis_server(workdir) as broker_url,
        platform_without_workers(workdir, broker_url=broker_url, env=FAST_LIFECYCLE) as p,
    ):
        p.import_config(SLEEPER)
        p.manage("mcp_discover", "probe")
        yield p


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedBetweenTests[Platform]]:
    shared = SharedBetweenTests(lambda: sleeper_platform(tmp_path_factory.mktemp("worker-loss")))
    yield shared
    shared.discard()


def unfinished_runs(platform: Platform) -> int:
    return platform.query("SELECT COUNT(*) FROM agents_run WHERE status NOT IN ('succeeded', 'failed', 'cancelled')")[
        0
    ][0]


@pytest.fixture
def platform(shared_platform: SharedBetweenTests[Platform]) -> Iterator[Platform]:
    """The module's platform, with no worker and no unfinished run: the test starts its workers, and every one
    still alive after it is killed (with what it started), so that none takes or reconciles the next test's run.
    A test that leaves a run unfinished (it failed) leaves a platform the next test does not get: a new one is
    made."""
    p = shared_platform.get()
    assert all(worker.process.poll() is not None for worker in p.workers) and unfinished_runs(p) == 0
    try:
        yield p
    finally:
        for worker in p.workers:
            if worker.process.poll() is None:
                worker.kill()
        if unfinished_runs(p):
            shared_platform.discard()


def submit(platform: Platform) -> str:
    with platform.client() as client:
        response = client.post("/api/v1/runs", json={"agent": "sleeper", "query": "잠깐 쉬었다가 답해줘"})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])


def wait_until_the_model_asks_for_sleep(platform: Platform, run_id: str) -> None:
    def asked_for_sleep() -> bool:
        return any("call_sleep" in str(e) for e in platform.run_events(run_id, "model_turn"))

    wait_until(asked_for_sleep, timeout=60, what="the model to call sleep")


def wait_until_the_tool_sleeps(platform: Platform, run_id: str) -> None:
    wait_until_the_model_asks_for_sleep(platform, run_id)
    # The call goes out within milliseconds of the model's turn, over the session echo opened; the tool
    # sleeps for 5 s: one second in, it is sleeping.
    time.sleep(1.0)


def wait_until_the_lease_lapses(platform: Platform, run_id: str) -> None:
    """Until the run's lease (3 s from its worker's last heartbeat) has lapsed, by the database's clock: a
    reconciler pass from then on takes the run for lost. (Read from the database, which costs nothing, rather than
    found by running ``reconcile_runs`` again and again, a process start each.)"""
    lapsed = "SELECT julianday(lease_expires_at) < julianday('now') FROM agents_run WHERE id = ?"
    wait_until(
        lambda: platform.query(lapsed, run_id.replace("-", ""))[0][0] == 1,
        timeout=30,
        what=f"the lease of run {run_id} to lapse",
        interval=0.1,
    )


def wait_until_finished(platform: Platform, run_id: str, timeout: float = 90) -> dict:
    wait_until(
        lambda: platform.run_row(run_id)["status"] in {"succeeded", "failed", "cancelled"},
        timeout=timeout,
        what=f"run {run_id} to finish",
        interval=0.3,
    )
    return platform.run_row(run_id)


def runs_left_running(platform: Platform) -> int:
    return platform.query("SELECT COUNT(*) FROM agents_run WHERE status = 'running'")[0][0]


def test_a_run_whose_worker_is_killed_mid_call_is_delivered_again_and_completes_once(platform: Platform) -> None:
    first = platform.start_worker("first")
    run_id = submit(platform)
    wait_until_the_model_asks_for_sleep(platform, run_id)
    # The second worker starts now, while the first holds the run's only message: it cannot take it, and it is
    # up by the time the run's lease lapses.
    second = platform.start_worker("second", wait=False)
    time.sleep(1.0)  # the sleep call is out: as in wait_until_the_tool_sleeps
    [first_pool] = first.pool_processes()
    first.kill()
    row = platform.run_row(run_id)
    assert (row["status"], row["delivery_count"], row["worker"].split(":")[1]) == ("running", 1, str(first_pool))

    second.wait_ready()
    row = wait_until_finished(platform, run_id)
    assert row["status"] == "succeeded", row["error_message"]
    assert row["answer"] == f'done: <tool_data>\n"slept {SLEEP_S}"\n</tool_data>'  # the model reads data
    # Delivered twice: the first worker's claim, then the second's after the reconciler queued it again. Its
    # lease (3 s) was renewed by the heartbeat through the 5-s sleep, or it would have been taken over again.
    [second_pool] = second.pool_processes()
    assert (row["delivery_count"], row["worker"].split(":")[1]) == (2, str(second_pool))
    # The audit records completed attempts: echo completed in both deliveries (a read call may repeat); the
    # sleep the first worker was killed in never completed, so the audit has its one successful execution.
    calls = [(tool, ok) for action, tool, ok, _attempt in platform.audit(run_id) if action == "tool.call"]
    assert calls == [("echo", 1), ("echo", 1), ("sleep", 1)]
    statuses = [(e["status"], e.get("delivery")) for e in platform.run_events(run_id, "status")]
    assert statuses == [("running", 1), ("queued", None), ("running", 2), ("succeeded", None)]
    assert runs_left_running(platform) == 0


def test_a_redelivery_while_the_lease_lives_waits_for_the_reconciler(platform: Platform) -> None:
    worker = platform.start_worker("only")
    run_id = submit(platform)
    wait_until_the_tool_sleeps(platform, run_id)
    # The OOM killer takes the pool process: the worker rejects the message (reject_on_worker_lost) and gets
    # it again, while the dead process's lease usually still runs; that delivery does nothing, and when the
    # lease has lapsed the reconciler queues the run again and the new pool process runs it. On a loaded
    # machine the new pool process may start after the lease lapsed and re-claim the run itself, or race the
    # reconciler's re-queue: every order must end with the run taken over exactly once.
    killed = worker.kill_pool_process()
    row = wait_until_finished(platform, run_id)
    assert row["status"] == "succeeded", row["error_message"]
    assert row["answer"] == f'done: <tool_data>\n"slept {SLEEP_S}"\n</tool_data>'  # the model reads data
    assert row["delivery_count"] == 2 and row["worker"].split(":")[1] != str(killed)
    log = worker.log.read_text(errors="replace")
    assert "WorkerLostError" in log
    taken_over = [
        f"run {run_id} queued again: worker_lost" in log,  # the reconciler, after the lease lapsed
        f"run {run_id}: the lease of " in log and "expired; re-claimed by" in log,  # a late redelivery itself
    ]
    assert any(taken_over), log[-4000:]
    # The sleep the pool process was killed in never completed: the audit has one execution of it, by the
    # delivery that took over; the killed delivery's echo and the second delivery's echo (a read) both completed.
    calls = [(tool, ok) for action, tool, ok, _attempt in platform.audit(run_id) if action == "tool.call"]
    assert calls == [("echo", 1), ("echo", 1), ("sleep", 1)]
    deliveries = [e.get("delivery") for e in platform.run_events(run_id, "status") if e["status"] == "running"]
    assert deliveries == [1, 2]
    assert runs_left_running(platform) == 0


# The worker and the operator's pass both count deliveries against this (the web server has no use for it).
ONE_DELIVERY = {"PLATFORM_RUN_MAX_DELIVERIES": "1"}


def test_a_run_never_stays_running_after_its_worker_is_gone(platform: Platform) -> None:
    worker = platform.start_worker("doomed", env=ONE_DELIVERY)
    run_id = submit(platform)
    wait_until_the_tool_sleeps(platform, run_id)
    worker.kill()
    assert platform.run_row(run_id)["status"] == "running"
    # No worker left: the operator's one-off pass (cron, or beat) ends the run once its lease has lapsed.
    wait_until_the_lease_lapses(platform, run_id)
    wait_until(
        lambda: "worker_lost: 1" in platform.manage("reconcile_runs", env=ONE_DELIVERY),
        timeout=60,
        what="the reconciler",
        interval=0.5,
    )
    row = platform.run_row(run_id)
    assert (row["status"], row["error_code"]) == ("failed", "worker_lost")
    assert row["finished_at"] is not None
    assert runs_left_running(platform) == 0
