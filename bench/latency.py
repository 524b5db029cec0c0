"""Latency: what a client waits for one run, and what of that is the worker, the tool and the platform.

Run from the repo root: ``python -m bench.latency [--runs 30] [--c8-runs 64] [--baseline-runs 10]
[--settings embedded,redis_sqlite,redis_postgres] [--no-baseline]``.

For every broker/database pair available here (``embedded``: the filesystem broker and SQLite, the default of
one machine; ``redis_sqlite``; ``redis_postgres``: a private PostgreSQL cluster, ``tests.postgres``), it starts
the platform as ``bench.load`` does (``tests.e2e.workers``: its own database, migrate, ``seed_demo``, an API key,
gunicorn with threads keeping their database connections, two workers with ``--concurrency=1``), warms the
workers' pooled MCP sessions, then sends the seed's questions to the demo agent as ``POST /api/v1/runs?wait=30``:
``--runs`` one after another (``seq``) and ``--c8-runs`` from 8 clients at once (``c8``). A setting whose server
is not installed is skipped.

A baseline is measured in the same run: the embedded setting with the waits of the starting point (the worker
polls the filesystem broker every second, ``?wait`` reads the run every 100 ms:
``PLATFORM_BROKER_POLL_S=1 PLATFORM_RUN_WAKEUP=poll PLATFORM_RUN_WAIT_MIN_POLL_S=0.1``), ``--baseline-runs``
runs, seq only.

Per setting and mode (``<setting>_<seq|c8>_...``): ``client_p50_ms`` (the POST with its wait, as the client saw
it), ``worker_p50_ms`` (``finished_at - started_at``), ``queue_p50_ms`` (``started_at - created_at``),
``tool_p50_ms`` (the run's tool calls' ``latency_ms``, as the gate measured them), and per embedded setting the
workers' idle CPU (``<setting>_idle_worker_cpu_pct``: the two workers and their pool processes, % of one core,
over ``--idle-s`` seconds with nothing to do). Then the issue's figures, one per line:

- ``embedded_client_p50_ms``: embedded, seq;
- ``redis_client_p50_ms``: Redis/SQLite, seq;
- ``wait_overhead_ms_p50``: client minus worker time per run, Redis/SQLite, seq;
- ``worker_minus_tool_ms_p50``: worker minus tool time per run, Redis/SQLite, seq (embedded where Redis is
  missing);
- last, the headline: ``embedded_speedup``: the baseline's client p50 / the embedded client p50 (seq); without a
  baseline or the embedded setting in the run, ``client_over_worker_p50``: the client's p50 over the worker's
  (Redis/SQLite, seq, else embedded). A figure of a setting not run is not printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench._stats import median, non_negative_int, positive_int

QUESTIONS = [
    "김하늘 님은 어느 팀 소속인가요?",
    "클라우드운영팀 인원이 몇 명인지 알려주세요.",
    "물류플랫폼팀 프로젝트 알려줘",
    "김하늘 님 보유 자산 알려줘",
]
SETTINGS = ("embedded", "redis_sqlite", "redis_postgres")
BASELINE_ENV = {"PLATFORM_BROKER_POLL_S": "1", "PLATFORM_RUN_WAKEUP": "poll", "PLATFORM_RUN_WAIT_MIN_POLL_S": "0.1"}


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(name: str, value: float | int, digits: int = 2) -> None:
    print(f"{name}: {round(value, digits) if isinstance(value, float) else value}", flush=True)


def p50(values: list[float]) -> float:
    return median(values)


def _ms(later: str, earlier: str) -> float:
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds() * 1000


class Sample:
    """One finished run as the client saw it and as the server recorded it."""

    def __init__(self, client_ms: float, body: dict[str, Any]) -> None:
        if body.get("status") != "succeeded":
            raise RuntimeError(f"run {body.get('id')} ended {body.get('status')}: {body.get('error')}")
        self.client_ms = client_ms
        self.worker_ms = _ms(body["finished_at"], body["started_at"])
        self.queue_ms = _ms(body["started_at"], body["created_at"])
        self.tool_ms = sum(call["latency_ms"] or 0.0 for call in body["tool_calls"])


def one_run(client: httpx.Client, i: int) -> Sample:
    t0 = time.perf_counter()
    response = client.post(
        "/api/v1/runs?wait=30", json={"agent": "company-assistant", "query": QUESTIONS[i % len(QUESTIONS)]}
    )
    client_ms = (time.perf_counter() - t0) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"run {i}: {response.status_code} {response.text[:300]}")
    return Sample(client_ms, response.json())


def sequential(client: httpx.Client, runs: int) -> list[Sample]:
    return [one_run(client, i) for i in range(runs)]


def from_clients(client: httpx.Client, runs: int, clients: int = 8) -> list[Sample]:
    def worker(k: int) -> list[Sample]:
        return [one_run(client, i) for i in range(k, runs, clients)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        return [s for found in pool.map(worker, range(clients)) for s in found]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def idle_worker_cpu_pct(platform: Any, seconds: float) -> float:
    """The workers' CPU (their main and pool processes, not the MCP servers) over ``seconds`` with no runs."""
    from tests.e2e.workers import children

    pids = [pid for w in platform.workers for pid in [w.process.pid, *children(w.process.pid)]]
    before = cpu_seconds(pids)
    time.sleep(seconds)
    return (cpu_seconds(pids) - before) / seconds * 100


@contextlib.contextmanager
def started(setting: str, workdir: Path, env: dict[str, str]) -> Iterator[Any]:
    from tests.e2e.harness import redis_server
    from tests.e2e.workers import platform_without_workers

    with contextlib.ExitStack() as stack:
        database_url = ""
        if setting == "redis_postgres":
            from tests.postgres import private_postgres

            database_url = stack.enter_context(private_postgres(durable=True))
        broker_url = "filesystem://" if setting == "embedded" else stack.enter_context(redis_server(workdir))
        platform = stack.enter_context(
            platform_without_workers(
                workdir,
                broker_url=broker_url,
                database_url=database_url,
                env={"PLATFORM_API_RATE": "1000000/min", "LOG_LEVEL": "WARNING", **env},
                web="gunicorn",
            )
        )
        for name in ("w1", "w2"):
            platform.start_worker(name, wait=False)
        for worker in platform.workers:
            worker.wait_ready()
        yield platform


def available(setting: str) -> bool:
    if setting != "embedded" and shutil.which("redis-server") is None:
        return False
    if setting == "redis_postgres":
        from tests.postgres import postgres_bindir

        return postgres_bindir() is not None
    return True


def measure(
    setting: str, *, env: dict[str, str], runs: int, c8_runs: int, idle_s: float, keep: bool = False
) -> dict[str, list[Sample] | float]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-latency-{setting}-"))
    t0 = time.monotonic()
    found: dict[str, list[Sample] | float] = {}
    try:
        with started(setting, workdir, env) as platform:
            progress(f"{setting}: up in {time.monotonic() - t0:.1f} s")
            with platform.client(timeout=60) as client:
                from_clients(client, 4, clients=4)  # each worker process opens its pooled MCP session
                if idle_s > 0:
                    found["idle_cpu_pct"] = idle_worker_cpu_pct(platform, idle_s)
                found["seq"] = sequential(client, runs)
                if c8_runs:
                    found["c8"] = from_clients(client, c8_runs)
    finally:
        if keep:
            progress(f"{setting}: logs and database kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    progress(f"{setting}: done in {time.monotonic() - t0:.1f} s")
    return found


def report_setting(name: str, found: dict[str, list[Sample] | float]) -> None:
    for mode in ("seq", "c8"):
        samples = found.get(mode)
        if not isinstance(samples, list):
            continue
        report(f"{name}_{mode}_client_p50_ms", p50([s.client_ms for s in samples]))
        report(f"{name}_{mode}_worker_p50_ms", p50([s.worker_ms for s in samples]))
        report(f"{name}_{mode}_queue_p50_ms", p50([s.queue_ms for s in samples]))
        report(f"{name}_{mode}_tool_p50_ms", p50([s.tool_ms for s in samples]))
    idle = found.get("idle_cpu_pct")
    if isinstance(idle, float):
        report(f"{name}_idle_worker_cpu_pct", idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=30, help="sequential runs per setting")
    parser.add_argument(
        "--c8-runs", type=non_negative_int, default=64, help="runs from 8 concurrent clients per setting (0: none)"
    )
    parser.add_argument("--baseline-runs", type=positive_int, default=10)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds to measure the idle workers' CPU")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--keep", action="store_true", help="keep each setting's folder (database, logs)")
    options = parser.parse_args()

    results: dict[str, dict[str, list[Sample] | float]] = {}
    for setting in [s.strip() for s in options.settings.split(",") if s.strip()]:
        if setting not in SETTINGS:
            parser.error(f"unknown setting {setting!r}; choose from {', '.join(SETTINGS)}")
        if not available(setting):
            progress(f"{setting}: skipped (its server is not installed)")
            continue
        idle_s = options.idle_s if setting == "embedded" else 0.0
        results[setting] = measure(
            setting, env={}, runs=options.runs, c8_runs=options.c8_runs, idle_s=idle_s, keep=options.keep
        )
        report_setting(setting, results[setting])
    if not options.no_baseline:
        results["baseline"] = measure(
            "embedded",
            env=BASELINE_ENV,
            runs=options.baseline_runs,
            c8_runs=0,
            idle_s=options.idle_s,
            keep=options.keep,
        )
        report_setting("baseline_embedded", results["baseline"])

    def seq(setting: str) -> list[Sample]:
        samples = results.get(setting, {}).get("seq")
        return samples if isinstance(samples, list) else []

    reference = seq("redis_sqlite") or seq("embedded")
    # Only what this run measured: a setting left out (``--settings redis_sqlite,…``) printed ``nan``.
    if seq("embedded"):
        report("embedded_client_p50_ms", p50([s.client_ms for s in seq("embedded")]))
    if seq("redis_sqlite"):
        report("redis_client_p50_ms", p50([s.client_ms for s in seq("redis_sqlite")]))
        report("wait_overhead_ms_p50", p50([s.client_ms - s.worker_ms for s in seq("redis_sqlite")]))
    if reference:
        report("worker_minus_tool_ms_p50", p50([s.worker_ms - s.tool_ms for s in reference]))
    before, after = seq("baseline"), seq("embedded")
    if before and after:
        report("embedded_speedup", p50([s.client_ms for s in before]) / p50([s.client_ms for s in after]))
    elif reference:
        # No embedded baseline in this run (``--no-baseline``, or the embedded setting left out): the headline is
        # the client's time over the worker's, both measured here (1.0: the client waits for nothing else).
        report("client_over_worker_p50", p50([s.client_ms for s in reference]) / p50([s.worker_ms for s in reference]))


if __name__ == "__main__":
    main()
