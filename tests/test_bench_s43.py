"""The benches' shared parts (``bench/_stats.py``) and how they end when the sizes are wrong or nothing worked:
one percentile for every bench (a p50 is the median), count options refused by argparse before anything starts,
``bench.load`` with no run succeeded (the counts, exit 1). (``bench.celery_hop`` with fewer tasks than its warm-up
is ``tests/e2e/test_bench_celery_hop.py``'s run: one platform start for both checks.)"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench._stats import median, percentile
from bench.load import QUESTIONS, WRITE_QUESTION, outcomes, query_of
from tests.e2e.harness import ROOT, bench_figures

NOT_PASSED_ON = ("PLATFORM_ALLOW_SCRIPTED_MODEL", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")


def bench(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` from the repository root, its folders under ``tmp_path``."""
    base = {k: v for k, v in os.environ.items() if k not in NOT_PASSED_ON}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env={**base, "PLATFORM_VAR_DIR": str(tmp_path / "var"), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_p50_of_an_even_count_is_the_mean_of_the_two_middle_values() -> None:
    assert percentile([4, 1, 3, 2], 0.5) == 2.5
    assert median([1, 2, 3, 4]) == 2.5
    assert median([3, 1, 2]) == 2


def test_a_percentile_interpolates_as_statistics_quantiles_inclusive() -> None:
    values = [float(v) for v in (12, 3, 7, 41, 5, 9, 30, 2, 18, 11, 6)]
    p95 = statistics.quantiles(values, n=20, method="inclusive")[18]
    assert percentile(values, 0.95) == pytest.approx(p95)
    assert percentile(values, 0.0) == 2.0 and percentile(values, 1.0) == 41.0


def test_one_sample_is_every_percentile_and_none_is_nan() -> None:
    assert percentile([7.0], 0.95) == 7.0
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        percentile([1.0], 95)


def test_every_nth_load_run_asks_the_question_that_calls_the_write_tool() -> None:
    assert [query_of(i, 0) for i in range(5)] == [QUESTIONS[i % len(QUESTIONS)] for i in range(5)]
    asked = [query_of(i, 3) for i in range(9)]
    assert [i for i, query in enumerate(asked) if query == WRITE_QUESTION] == [2, 5, 8]
    assert all(query_of(i, 1) == WRITE_QUESTION for i in range(4))


def test_the_load_outcomes_count_each_way_a_run_did_not_succeed() -> None:
    finished = {"a": {"status": "succeeded"}, "b": {"status": "failed"}, "c": {"status": "cancelled"}}
    counts = outcomes(["a", "b", "c", "d", "e"], finished)
    assert counts == {"succeeded": 1, "lost": 4, "failed": 1, "cancelled": 1, "unfinished": 2}


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["bench.gate", "--calls", "0"],
        ["bench.tracing", "--calls", "-1"],
        ["bench.history", "--requests", "0"],
        ["bench.mcp_calls", "--calls", "0"],
        ["bench.rules", "--rounds", "0"],
        ["bench.shadow", "--runs", "0"],
        ["bench.load", "--clients", "0"],
        ["bench.latency", "--runs", "0"],
        ["bench.recovery", "--samples", "0"],
        ["bench.celery_hop", "--tasks", "0"],
        ["bench.evals", "--cases", "0"],
        ["bench.audit", "--writers", "-1"],
    ],
    ids=lambda command: command[0],
)
def test_a_count_below_its_least_is_a_usage_error_before_anything_starts(tmp_path: Path, command: list[str]) -> None:
    done = bench(tmp_path, *command, timeout=60)

    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert "usage:" in done.stderr
    assert f"argument {command[1]}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "var").exists()  # nothing was set up


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.redis
def test_bench_load_with_no_run_succeeded_prints_the_counts_and_exits_1(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    # Nothing is waited for: every run is still queued or running when the bench stops waiting. One worker (the
    # default is two): how many run the queue changes nothing here, and each costs a start and a warm shutdown.
    done = bench(
        tmp_path, "bench.load", "--runs", "6", "--clients", "3", "--workers", "1", "--timeout", "0", timeout=300
    )

    assert done.returncode == 1, done.stdout + done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    found = bench_figures(done.stdout)
    assert found["runs"] == 6
    assert found["succeeded"] == 0
    assert found["lost"] == found["unfinished"] == 6
    assert found["failed"] == found["cancelled"] == 0
    assert "runs_per_second" not in found  # no figure of runs that were not measured
    # Progress once, not once per unfinished run.
    assert done.stderr.count("/6 finished") == 1, done.stderr[-4000:]
