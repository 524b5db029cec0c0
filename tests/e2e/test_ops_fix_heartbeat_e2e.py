"""A worker that stops cleanly (SIGTERM: Celery's warm shutdown) removes its own heartbeat row, so ``/readyz`` and
``platform_workers_alive`` stop counting it at once (they counted it for up to ``PLATFORM_READY_WORKER_MAX_AGE_S``,
and a restarted worker twice); a worker killed outright leaves its row to age out. Real workers on the embedded
broker."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import wait_until
from tests.e2e.workers import Platform, Worker, platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def heartbeats(platform: Platform) -> list[str]:
    return sorted(worker for (worker,) in platform.query("SELECT worker FROM agents_workerheartbeat"))


def its_heartbeat(worker: Worker) -> str:
    return f"{socket.gethostname()}:{worker.process.pid}"


def workers_alive(platform: Platform) -> float:
    for line in httpx.get(f"{platform.base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("platform_workers_alive "):
            return float(line.split()[1])
    raise AssertionError("no platform_workers_alive in /metrics")


def test_a_worker_stopped_cleanly_is_no_longer_counted_and_one_killed_ages_out(tmp_path: Path) -> None:
    with platform_without_workers(tmp_path, broker_url="filesystem://", env={"PLATFORM_WORKER_HEARTBEAT_S": "1"}) as p:
        stopped = p.start_worker("stopped")
        wait_until(lambda: heartbeats(p) == [its_heartbeat(stopped)], timeout=30, what="the first heartbeat")
        assert httpx.get(f"{p.base_url}/readyz", timeout=30).status_code == 200

        stopped.stop()  # SIGTERM

        assert stopped.process.returncode == 0, stopped.log.read_text(errors="replace")
        assert heartbeats(p) == []
        readyz = httpx.get(f"{p.base_url}/readyz", timeout=30)
        assert readyz.status_code == 503 and readyz.json()["checks"]["worker"]["ok"] is False
        assert workers_alive(p) == 0

        restarted = p.start_worker("restarted")
        wait_until(lambda: heartbeats(p) == [its_heartbeat(restarted)], timeout=30, what="the restarted heartbeat")
        assert workers_alive(p) == 1

        restarted.kill()  # SIGKILL: nothing runs, the row stays until it ages out

        assert heartbeats(p) == [its_heartbeat(restarted)]
