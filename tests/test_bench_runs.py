"""Each benchmark that no other test runs, run at a small size as a subprocess with the project's Python from the
repository root: it exits 0 and prints as the project's rule asks: every figure is a ``name: value`` line whose
value is a number, and the last line is the headline ratio (against a baseline measured in the same run, except
``bench.recovery``'s documented one), a positive finite number. Timings are not checked, only a few counts that
say the bench did what it reports.

The benches' own folders (``tempfile.mkdtemp``) go under the test's ``tmp_path`` (``TMPDIR``), and so does
``PLATFORM_VAR_DIR``. The suite's ``PLATFORM_ALLOW_SCRIPTED_MODEL`` (tests/conftest.py) is not passed on: a bench
that needs the scripted model sets it itself, as it must when run by hand."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT

pytestmark = [pytest.mark.slow]

SERVERS = [pytest.mark.e2e, pytest.mark.redis]  # starts a web server, Celery workers and a private Redis

# What the environment of the test process holds for the suite's sake or names another database or broker.
NOT_PASSED_ON = ("PLATFORM_ALLOW_SCRIPTED_MODEL", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")

FIGURE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*): (?P<value>\S+)$")

CASES = [
    pytest.param(["bench.gate", "--calls", "20"], {}, "gate_over_direct_p50", {}, id="gate"),
    pytest.param(["bench.tracing", "--calls", "20"], {}, "traced_over_untraced_p50", {}, id="tracing"),
    pytest.param(
        ["bench.mcp_calls", "--calls", "10", "--baseline-calls", "1", "--soak", "50"],
        {},
        "pool_speedup_vs_session_per_call",
        {"soak_calls": 50, "server_processes_after_shutdown": 0},
        id="mcp_calls",
    ),
    pytest.param(
        ["bench.rules", "--rounds", "3", "--model-latency-ms", "5"],
        {},
        "rules_over_no_rules_ms_per_run",
        {"rules_direct_model_calls_per_run": 0.25},
        id="rules",
    ),
    pytest.param(
        [
            "bench.audit",
            "--events",
            "50",
            "--writers",
            "2",
            "--concurrent-events",
            "100",
            "--verify-events",
            "20000",
            "--no-postgres",
        ],
        {},
        "sqlite_deferred_vs_inline_2_writers_ratio",
        {"sqlite_verify_events": 20000},
        id="audit",
    ),
    # No concurrent writers (``--writers 0``): the headline is one writer's ratio (it printed none).
    pytest.param(
        ["bench.audit", "--events", "50", "--writers", "0", "--verify-events", "20000", "--no-postgres"],
        {},
        "sqlite_deferred_vs_inline_1_writer_ratio",
        {"sqlite_verify_events": 20000},
        id="audit-no-writers",
    ),
    pytest.param(
        ["bench.shadow", "--runs", "4"],
        {},
        "caller_p50_with_shadow_over_without",
        {"late_shadows": 0},
        id="shadow",
        marks=SERVERS,
    ),
    pytest.param(
        ["bench.evals", "--cases", "12", "--shadow-runs", "0"],
        {},
        "eval_vs_live_throughput",
        {"eval_cases": 12},
        id="evals",
        marks=SERVERS,
    ),
    # Without its in-run baseline: it printed a figure of the embedded setting it did not run (nan) and no headline.
    pytest.param(
        ["bench.latency", "--settings", "redis_sqlite", "--runs", "2", "--c8-runs", "8", "--no-baseline"],
        {},
        "client_over_worker_p50",
        {},
        id="latency-no-baseline",
        marks=SERVERS,
    ),
    # Short leases so that the kill is taken over within seconds (the workers inherit the bench's environment). The
    # probe sleeps 3 s, not 6: the kill comes one second into the sleep (2 s to spare on a loaded machine), and the
    # second delivery, which sleeps in full, takes 3 s less.
    pytest.param(
        ["bench.recovery", "--samples", "1", "--sleep-s", "3"],
        {"PLATFORM_RUN_LEASE_S": "3", "PLATFORM_RECONCILE_INTERVAL_S": "1"},
        "worker_loss_recovery_speedup_vs_documented_baseline",
        {"worker_loss_samples": 1, "worker_loss_lost": 0, "lease_s": 3, "baseline_measured_in_this_run": 0},
        id="recovery",
        marks=SERVERS,
    ),
]


def figures_of(stdout: str) -> list[tuple[str, float]]:
    """The output's figures in order; every line that has the form of one must be one (a number)."""
    found = []
    for line in stdout.splitlines():
        if ": " not in line:
            continue  # a table (bench.rules) or a note (bench.recovery's baseline)
        match = FIGURE.match(line)
        assert match, f"not a `name: value` figure: {line!r}"
        value = float(match["value"])  # a number, or this raises
        found.append((match["name"], value))
    return found


@pytest.mark.parametrize(("command", "env", "headline", "expected"), CASES)
def test_the_bench_runs_and_prints_its_figures_with_the_headline_ratio_last(
    tmp_path: Path, command: list[str], env: dict[str, str], headline: str, expected: dict[str, float]
) -> None:
    if command[0] in {"bench.shadow", "bench.evals", "bench.recovery", "bench.latency"} and not shutil.which(
        "redis-server"
    ):
        pytest.skip("redis-server is not installed")
    base = {k: v for k, v in os.environ.items() if k not in NOT_PASSED_ON}
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env={**base, "PLATFORM_VAR_DIR": str(tmp_path / "var"), "TMPDIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "password" not in done.stdout  # a seeding command's report (the demo admin's password) is not a figure
    figures = figures_of(done.stdout)
    assert figures, done.stdout
    assert all(math.isfinite(value) for _name, value in figures), done.stdout  # no figure of what was not measured
    last_line = done.stdout.strip().splitlines()[-1]
    name, value = figures[-1]
    assert last_line.startswith(f"{name}: ")  # the last line of all is a figure: the headline
    assert name == headline
    assert math.isfinite(value) and value > 0, last_line
    found = dict(figures)
    for figure, wanted in expected.items():
        assert found[figure] == wanted, (figure, found.get(figure))
