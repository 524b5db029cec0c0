"""``python -m bench.celery_hop`` at a small size: the worker imports the bench module (``--include``), notes every
task's receipt and start, and the bench prints each figure, the headline last. Timings are not checked, only that
each was measured (the bench exits non-zero when a task was not seen starting)."""

from __future__ import annotations

import shutil

import pytest

from tests.e2e.harness import bench_figures, run_bench

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]


def test_the_queue_hop_is_measured_from_publish_to_task_start_against_a_plain_redis_hop() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    done = run_bench("bench.celery_hop", "--tasks", "25", "--gap-ms", "10", timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    found = bench_figures(done.stdout)
    names = [line.partition(": ")[0] for line in done.stdout.splitlines() if ": " in line]
    assert names[-1] == "celery_hop_vs_redis_hop_ratio"
    for name in ("send_task_ms_p50", "publish_to_received_ms_p50", "received_to_task_start_ms_p50", "redis_hop_ms_p50"):
        assert found[name] > 0, name
    # The parts add up: publish to start is publish to receipt plus the hand-over, task by task (medians differ).
    assert found["celery_hop_ms_p50"] >= found["received_to_task_start_ms_p50"]
    assert found["celery_hop_ms_p95"] >= found["celery_hop_ms_p50"]
