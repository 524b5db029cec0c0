"""A worker asked to stop stops promptly, and a warm shutdown still finishes what it took.

- The embedded broker's drain gives up once the worker is stopping (``celery.worker.state``'s flags, which SIGTERM
  sets), before it takes another message: an idle worker no longer waits out Celery's two-second drain (twice), and
  a message queued meanwhile stays queued for the next worker.
- The worker's main process exits without Python's final walk of its heap (``gc.freeze`` at ``atexit``).
- A task in flight when SIGTERM comes is still finished, and Celery's prefetch still holds: a second message is not
  taken by the stopping worker.

This module is also the real workers' ``--include``: the task below, and (where ``S47_FREEZE_FILE`` is set, only in
a worker started here) an ``atexit`` hook that records whether the heap was frozen when the process exited."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.worker import state as worker_state
from kombu import Connection, Consumer, Queue

from agent_platform import embedded_broker
from agent_platform.celery import app
from tests.e2e.harness import ROOT, wait_until
from tests.e2e.workers import descendants

KOREAN = "김하늘 님은 어느 팀 소속인가요?"


@app.task(name="s47.hold_until_released")
def hold_until_released(folder: str, text: str) -> None:
    """Say it started, wait until the test releases it (after the worker was told to stop), then write ``text``."""
    Path(folder, "started").write_text(text, encoding="utf-8")
    while not Path(folder, "release").exists():
        time.sleep(0.01)
    Path(folder, "done").write_text(text, encoding="utf-8")


if os.environ.get("S47_FREEZE_FILE"):  # in a worker this module started: registered before the worker's own hooks

    def _record_freeze_count(path: str = os.environ["S47_FREEZE_FILE"]) -> None:
        Path(path).write_text(str(gc.get_freeze_count()), encoding="ascii")

    atexit.register(_record_freeze_count)


# ---- the drain, against the embedded transport ------------------------------------------------------------------


def broker_options(root: Path) -> dict[str, Any]:
    for name in ("queue", "processed", "control"):
        (root / name).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(root / "queue"),
        "data_folder_out": str(root / "queue"),
        "processed_folder": str(root / "processed"),
        "control_folder": str(root / "control"),
        "store_processed": False,
        "polling_interval": 0.01,
    }


@pytest.fixture
def consumer(tmp_path: Path) -> Iterator[tuple[Connection, list[Any], Path]]:
    """A connection consuming the ``celery`` queue of a broker folder, and what it was delivered."""
    options = broker_options(tmp_path / "broker")
    delivered: list[Any] = []
    with (
        Connection("filesystem://", transport=embedded_broker.Transport, transport_options=options) as connection,
        Consumer(
            connection.channel(),
            queues=[Queue("celery")],
            callbacks=[lambda body, message: (delivered.append(body), message.ack())],
            accept=["json"],
        ),
    ):
        yield connection, delivered, tmp_path / "broker" / "queue"


@pytest.mark.parametrize(
    ("flag", "value"), [("should_stop", 0), ("should_stop", 1), ("should_terminate", True)], ids=["warm", "1", "cold"]
)
def test_a_stopping_worker_takes_no_further_message(
    consumer: tuple[Connection, list[Any], Path], monkeypatch: pytest.MonkeyPatch, flag: str, value: object
) -> None:
    """A warm shutdown's flag is 0 (EX_OK): it counts, though it is false."""
    connection, delivered, queue_folder = consumer
    with connection.Producer() as producer:
        producer.publish({"query": KOREAN}, routing_key="celery")
    monkeypatch.setattr(worker_state, flag, value)
    with pytest.raises(TimeoutError):
        connection.drain_events(timeout=600)
    assert delivered == []
    assert len(list(queue_folder.glob("*.msg"))) == 1  # still queued, for the next worker

    monkeypatch.setattr(worker_state, flag, None)
    connection.drain_events(timeout=600)
    assert delivered == [{"query": KOREAN}]


def test_a_running_worker_still_takes_its_messages(consumer: tuple[Connection, list[Any], Path]) -> None:
    """Neither flag set (``None``), or set to False as Celery resets it: the drain delivers as kombu's does."""
    connection, delivered, _queue_folder = consumer
    assert worker_state.should_stop is None
    assert worker_state.should_terminate is None
    with connection.Producer() as producer:
        producer.publish({"n": 1}, routing_key="celery")
    connection.drain_events(timeout=600)
    assert delivered == [{"n": 1}]
    with pytest.raises(TimeoutError):  # an empty queue: the drain's own timeout, as kombu's
        connection.drain_events(timeout=0.05)


# ---- real workers on the embedded broker --------------------------------------------------------------------------


def start_worker(root: Path, log: Path) -> subprocess.Popen[bytes]:
    """``celery worker`` on its own platform folder, with no timers (none needs the database here) and this module
    included."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(
        PLATFORM_VAR_DIR=str(root / "var"),
        S47_FREEZE_FILE=str(root / "freeze-count"),
        PLATFORM_RECONCILE_IN_WORKER="0",
        PLATFORM_WORKER_HEARTBEAT_S="0",
        AUDIT_ANCHOR_INTERVAL_S="0",
        AUDIT_CHAIN_INTERVAL_S="0",
        PLATFORM_EVAL_REFRESH_S="0",
        PLATFORM_MCP_OPEN_AT_START="0",
        CELERY_TASK_ALWAYS_EAGER="0",
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agent_platform",
            "worker",
            "--concurrency=1",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--include=tests.test_s47_worker_stop",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(lambda: b" ready." in log.read_bytes() or process.poll() is not None, timeout=120, what="the worker")
    assert process.poll() is None, log.read_text(errors="replace")
    return process


@contextlib.contextmanager
def worker(root: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    log = root / "worker.log"
    process = start_worker(root, log)
    pool = descendants(process.pid)
    try:
        yield process, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        for pid in pool:  # none left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def publish(root: Path, *args: str) -> None:
    options = broker_options(root / "var" / "broker")
    with Connection("filesystem://", transport=embedded_broker.Transport, transport_options=options) as connection:
        app.send_task("s47.hold_until_released", args=list(args), connection=connection)


def left_behind(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not even a zombie: each was reaped)."""
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_warm_shutdown_finishes_the_task_in_flight_and_leaves_the_next_queued(tmp_path: Path) -> None:
    with worker(tmp_path) as (process, log):
        pool = descendants(process.pid)
        first, second = tmp_path / "first", tmp_path / "second"
        first.mkdir()
        second.mkdir()
        publish(tmp_path, str(first), KOREAN)
        wait_until(lambda: (first / "started").exists(), timeout=60, what="the first task to start")
        publish(tmp_path, str(second), "second")
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: b"Warm shutdown" in log.read_bytes(), timeout=60, what="the warm shutdown to begin")
        (first / "release").touch()
        (second / "release").touch()  # were the second taken, nothing would hold it
        assert process.wait(timeout=120) == 0, log.read_text(errors="replace")

    assert (first / "done").read_text(encoding="utf-8") == KOREAN
    assert not (second / "started").exists()
    assert len(list((tmp_path / "var" / "broker" / "queue").glob("*.msg"))) == 1  # for the next worker
    assert left_behind(pool) == []


@pytest.mark.e2e
@pytest.mark.slow
def test_an_idle_worker_exits_cleanly_without_the_final_collection(tmp_path: Path) -> None:
    with worker(tmp_path) as (process, log):
        pool = descendants(process.pid)
        assert pool  # its pool process
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text(errors="replace")

    assert int((tmp_path / "freeze-count").read_text(encoding="ascii")) > 0
    assert left_behind(pool) == []
