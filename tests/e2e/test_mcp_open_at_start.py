"""A worker's pool process opens the shared sessions of the servers its agents use as it starts
(``PLATFORM_MCP_OPEN_AT_START``, ``agent_platform/celery.py``): the demo's stdio server is running before the
first run arrives, and that run's call goes over it (no second server is started). Turned off, the server starts
with the first call, as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import wait_until
from tests.e2e.workers import Platform, Worker, descendants, platform_without_workers

pytestmark = [pytest.mark.e2e]


def demo_servers(worker: Worker) -> list[int]:
    """The demo MCP server processes below the worker's pool processes."""
    found = []
    for pool_pid in worker.pool_processes():
        for pid in descendants(pool_pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mcpregistry.demo_server" in argv:
                found.append(pid)
    return found


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """One web server and database for both tests: each starts a worker of its own and stops it before it ends,
    so the other test's run is never taken by it (and its MCP servers go with it)."""
    with platform_without_workers(tmp_path_factory.mktemp("open-at-start"), broker_url="filesystem://") as running:
        yield running


@pytest.fixture
def stopped_at_the_end(platform: Platform) -> Iterator[None]:
    started = len(platform.workers)
    yield
    for worker in platform.workers[started:]:
        worker.stop()


@pytest.mark.usefixtures("stopped_at_the_end")
def test_the_demo_server_is_running_before_the_first_run_and_serves_it(platform: Platform) -> None:
    worker = platform.start_worker("w1")
    wait_until(
        lambda: "session opened at start" in worker.log.read_text(errors="replace"),
        timeout=60,
        what="the demo server's session opened at start",
    )
    [opened] = demo_servers(worker)

    with platform.client(timeout=120) as client:
        done = client.post(
            "/api/v1/runs?wait=60", json={"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}
        ).json()
    assert done["status"] == "succeeded", done
    assert [c["name"] for c in done["tool_calls"]] == ["search_employee"]
    assert demo_servers(worker) == [opened]  # the run's call went over the session opened at start


@pytest.mark.usefixtures("stopped_at_the_end")
def test_turned_off_the_server_starts_with_the_first_call(platform: Platform) -> None:
    worker = platform.start_worker("w2", env={"PLATFORM_MCP_OPEN_AT_START": "0"})
    assert demo_servers(worker) == []
    with platform.client(timeout=120) as client:
        done = client.post(
            "/api/v1/runs?wait=60", json={"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}
        ).json()
    assert done["status"] == "succeeded", done
    assert len(demo_servers(worker)) == 1
