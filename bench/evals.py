"""Evals: a 200-case eval set run with ``manage.py run_eval`` through real Celery workers, against the same
queries submitted as live runs through the API.

Run from the repo root: ``python -m bench.evals [--cases 200] [--workers 8] [--shadow-runs 30]``.

It starts the platform as ``tests/e2e`` does (``tests.e2e.workers``): its own SQLite file, a private
``redis-server`` as the broker, migrate, ``seed_demo``, an API key, the web server and two Celery workers
(``--concurrency=1`` each). The demo agent ``company-assistant`` answers offline (no model) from its rules. The
set is seed 001's tool questions (``evals/fixtures/seed_001_tool_questions.json``) repeated to ``--cases``
cases, imported with ``import_config``; ``run_eval`` keeps ``--workers`` cases in flight and scores each as its
run finishes.

Figures (``name: value`` lines):

- ``eval_cases``, ``eval_passed``: cases run and passed (the offline agent fails the team-projects question:
  its rules find the employee, not the team's projects).
- ``eval_seconds``: the eval run's own start to finish (``EvalRun.created_at`` → ``finished_at``): submitting,
  executing and scoring every case.
- ``eval_cases_per_second``: cases / ``eval_seconds``.
- ``live_runs_per_second``: the same queries as live runs, POSTed to ``/api/v1/runs`` by 16 threads: the
  succeeded ones over their first ``created_at`` → last ``finished_at``: the baseline, measured in the same run on
  the same workers; ``live_runs_failed``: those that did not succeed (failed, or unfinished after 300 s; the
  bench then exits 1 once its figures are printed).
- ``caller_p50_ms_without_shadow``, ``caller_p50_ms_with_shadow``, ``shadow_added_latency_ms_p50`` (and
  ``_back_to_back``): what a shadow adds to the caller's latency, from ``python -m bench.shadow --runs
  --shadow-runs`` on a platform of its own (its docstring says how); ``--shadow-runs 0`` skips it. The eval's
  figures are printed before it starts; where it fails, its stderr shows why and the bench exits 1.
- ``eval_vs_live_throughput``: ``eval_cases_per_second / live_runs_per_second`` (1.0: an eval costs what the
  same traffic costs; the eval's windowing and scoring are its overhead).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._stats import non_negative_int, positive_int

SEED_SET = Path(__file__).resolve().parent.parent / "evals" / "fixtures" / "seed_001_tool_questions.json"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(name: str, value: float | int, digits: int = 2) -> None:
    print(f"{name}: {round(value, digits) if isinstance(value, float) else value}", flush=True)


def when(text: str) -> datetime:
    return datetime.fromisoformat(str(text).replace(" ", "T"))


def bench_set(cases: int) -> dict[str, Any]:
    seed = json.loads(SEED_SET.read_text(encoding="utf-8"))["eval_sets"][0]
    rows = seed["cases"]
    return {
        **seed,
        "name": f"bench-{cases}",
        "thresholds": {},
        "cases": [{**rows[i % len(rows)], "key": f"case-{i + 1:03d}"} for i in range(cases)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=positive_int, default=200)
    parser.add_argument("--workers", type=positive_int, default=8, help="run_eval's cases in flight")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (database, logs)")
    parser.add_argument(
        "--shadow-runs",
        type=non_negative_int,
        default=30,
        help="runs per condition of the shadow figure (bench.shadow, on a platform of its own; 0: skip it)",
    )
    options = parser.parse_args()

    from tests.e2e.harness import redis_server
    from tests.e2e.workers import platform_without_workers

    workdir = Path(tempfile.mkdtemp(prefix="bench-evals-"))
    document = bench_set(options.cases)
    queries = [c["question"] for c in document["cases"]]
    with contextlib.ExitStack() as stack:
        broker_url = stack.enter_context(redis_server(workdir))
        platform = stack.enter_context(
            platform_without_workers(
                workdir,
                broker_url=broker_url,
                env={"PLATFORM_API_RATE": "1000000/min", "LOG_LEVEL": "WARNING"},
                web="gunicorn",
            )
        )
        for name in ("w1", "w2"):
            platform.start_worker(name, wait=False)
        for worker in platform.workers:
            worker.wait_ready()
        platform.import_config({"eval_sets": [document]})
        progress(f"platform up ({workdir}); warming the workers' MCP sessions")
        with platform.client(timeout=60) as client:
            warm = [
                client.post("/api/v1/runs", json={"agent": "company-assistant", "query": q}).json()["id"]
                for q in queries[:4]
            ]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(
                client.get(f"/api/v1/runs/{r}").json()["status"] not in {"succeeded", "failed"} for r in warm
            ):
                time.sleep(0.2)

            progress(f"eval: run_eval company-assistant {document['name']} --workers {options.workers}")
            platform.manage("run_eval", "company-assistant", document["name"], "--workers", str(options.workers))
            (created, finished, summary) = platform.query(
                "SELECT created_at, finished_at, summary FROM evals_evalrun ORDER BY created_at DESC LIMIT 1"
            )[0]
            eval_s = (when(finished) - when(created)).total_seconds()
            scores = json.loads(summary)

            progress(f"baseline: the same {len(queries)} queries as live runs through the API")
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                live = list(
                    pool.map(
                        lambda q: client.post("/api/v1/runs", json={"agent": "company-assistant", "query": q}).json()[
                            "id"
                        ],
                        queries,
                    )
                )
            deadline = time.monotonic() + 300
            ids = tuple(r.replace("-", "") for r in live)
            marks = ",".join("?" * len(ids))
            while time.monotonic() < deadline:
                left = platform.query(
                    f"SELECT COUNT(*) FROM agents_run WHERE id IN ({marks}) AND finished_at IS NULL", *ids
                )[0][0]
                if not left:
                    break
                time.sleep(0.2)
            # Succeeded runs only, over their own span: a failed run is no throughput, and one unfinished at the
            # deadline has no finished_at (MAX() skipped it, and the rate counted it as done).
            live_succeeded, first, last = platform.query(
                f"SELECT COUNT(*), MIN(created_at), MAX(finished_at) FROM agents_run WHERE id IN ({marks}) "
                "AND status = 'succeeded'",
                *ids,
            )[0]
    live_failed = len(live) - int(live_succeeded)
    live_rate = int(live_succeeded) / (when(last) - when(first)).total_seconds() if live_succeeded else 0.0

    # The eval's figures first: a failing shadow step below loses none of them.
    report("eval_cases", scores["cases"])
    report("eval_passed", scores["passed"])
    report("eval_seconds", eval_s)
    report("eval_cases_per_second", scores["cases"] / eval_s)
    report("live_runs_failed", live_failed)
    report("live_runs_per_second", live_rate)
    if not live_succeeded:
        sys.exit("no live run succeeded: no baseline")

    shadow: dict[str, str] = {}
    if options.shadow_runs > 0:
        progress(f"shadow: python -m bench.shadow --runs {options.shadow_runs}")
        import subprocess

        # Its stderr (progress, and why it failed) goes to ours; its stdout is its figures.
        finished_shadow = subprocess.run(
            [sys.executable, "-m", "bench.shadow", "--runs", str(options.shadow_runs)],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if finished_shadow.returncode != 0:
            sys.exit(f"python -m bench.shadow failed ({finished_shadow.returncode}); the figures above stand")
        for line in finished_shadow.stdout.splitlines():
            name, _, value = line.partition(": ")
            if value:
                shadow[name] = value

    for name in (
        "caller_p50_ms_without_shadow",
        "caller_p50_ms_with_shadow",
        "shadow_added_latency_ms_p50_back_to_back",
        "shadow_added_latency_ms_p50",
    ):
        if name in shadow:
            print(f"{name}: {shadow[name]}", flush=True)
    report("eval_vs_live_throughput", (scores["cases"] / eval_s) / live_rate)
    if not options.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    if live_failed:
        sys.exit(f"{live_failed} live runs did not succeed (live_runs_failed)")


if __name__ == "__main__":
    main()
