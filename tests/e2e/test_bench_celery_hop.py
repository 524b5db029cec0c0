"""``python -m bench.celery_hop`` at a small size: the worker imports the bench module (``--include``), notes every
task's receipt and start, and the bench prints each figure, the headline last. Timings are not checked, only that
each was measured (the bench exits non-zero when a task was not seen starting).

One run covers both what was two tests (each started its own Redis, web server and worker): the figures of a
normal run, and a run of fewer tasks than its warm-up (``--tasks 2``, ``WARM`` = 20), which must still measure
both hops. The bench publishes ``--tasks`` + ``WARM`` messages on each side whatever ``--tasks`` is, and measures
the last ``--tasks`` of them: a larger count takes the same path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.celery_hop import WARM
from tests.e2e.harness import ROOT, bench_figures

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.slow]

# What the environment of the test process holds for the suite's sake or names another database or broker.
NOT_PASSED_ON = ("PLATFORM_ALLOW_SCRIPTED_MODEL", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")
TASKS = 2


def test_the_queue_hop_from_publish_to_task_start_is_measured_against_a_redis_hop_with_fewer_tasks_than_warm_up(
    tmp_path: Path,
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    assert TASKS < WARM  # fewer measured tasks than the warm-up's
    base = {k: v for k, v in os.environ.items() if k not in NOT_PASSED_ON}
    done = subprocess.run(
        [sys.executable, "-m", "bench.celery_hop", "--tasks", str(TASKS), "--gap-ms", "10"],
        cwd=ROOT,
        env={**base, "PLATFORM_VAR_DIR": str(tmp_path / "var"), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    found = bench_figures(done.stdout)
    names = [line.partition(": ")[0] for line in done.stdout.splitlines() if ": " in line]
    assert names[-1] == "celery_hop_vs_redis_hop_ratio"
    assert done.stdout.strip().splitlines()[-1].startswith("celery_hop_vs_redis_hop_ratio: ")
    for name in ("send_task_ms_p50", "publish_to_received_ms_p50", "received_to_task_start_ms_p50", "redis_hop_ms_p50"):
        assert found[name] > 0, name
    # The parts add up: publish to start is publish to receipt plus the hand-over, task by task (medians differ).
    assert found["celery_hop_ms_p50"] >= found["received_to_task_start_ms_p50"]
    assert found["celery_hop_ms_p95"] >= found["celery_hop_ms_p50"]
