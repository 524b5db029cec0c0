"""Load: many runs submitted at once through the API to two Celery workers, from submission to ``succeeded``.

Run from the repo root: ``python -m bench.load [--runs 500] [--clients 100] [--web gunicorn|uvicorn|runserver]
[--postgres] [--workers 2] [--kill-midway] [--write-every N]``.

Scale-out: ``python -m bench.load --postgres --workers 4 --runs 2000 --clients 200 [--kill-midway --write-every
10]`` (four worker processes, Redis, PostgreSQL). With ``--kill-midway`` one worker is SIGKILLed with everything it started once
half of the runs have finished, and a replacement is started at once; the workers then run with short leases
(``PLATFORM_RUN_LEASE_S=3``, ``PLATFORM_RECONCILE_INTERVAL_S=1``, as ``tests/e2e/test_worker_loss.py``) so that
the killed worker's run is taken over within seconds. After the runs, the database is read (``manage.py
shell``) for runs that finished twice and tool calls completed twice.

It starts the platform as ``tests/e2e`` does (``tests.e2e.workers``): its own SQLite file (or, with
``--postgres``, a private PostgreSQL cluster), a private ``redis-server`` as the broker, migrate, ``seed_demo``,
an API key, the web server (gunicorn with threads: under ASGI the API's synchronous views take turns on one
thread; each thread keeps its database connection, ``DB_CONN_MAX_AGE=60`` unless the environment sets it), and
two workers (``--concurrency=1`` each). The demo agent ``company-assistant`` answers the seed's questions offline:
one call to the demo MCP server from its deterministic rules (stdio, a pooled session per worker process) and one
turn of the offline model, which composes the answer from the call's result. ``--runs`` runs (the seed's
questions in turn) are POSTed by ``--clients`` threads sharing one httpx client, all released together; the
runs are then polled (``GET /api/v1/runs/{id}``) until every one has finished, or ``--timeout`` passed.

With ``--write-every N`` (default 0: none, the figures recorded so far), every N-th run asks seed 001's
arithmetic question instead, which the demo's rule answers with the local ``calculate`` tool, marked a write tool
for the benchmark (``tool_contract_update``, ``risk=write``). A write call waits for an approval (every write
does): the poller approves it as the run's API caller (``POST /api/v1/runs/{id}/approvals/{approval_id}``, which
a rule's call allows) and the run resumes and makes the call. These runs' ``e2e`` includes that wait. Without
writes, ``write_calls_twice`` checks nothing (every tool of the demo reads): use it with ``--kill-midway``.

Figures (``name: value`` lines; the last is the headline ratio ``runs_per_second_over_at_full_cpu``, or
``runs_per_second`` where ``/proc`` is not there), from each run's own timestamps and audit:

- ``lost``: runs not ``succeeded`` at the end: must be 0; of them ``failed``, ``cancelled`` and ``unfinished``
  (still queued, running or waiting for an approval at ``--timeout``). When no run succeeded, only these counts
  (and the database's) are printed, and the benchmark exits 1.
- ``submit_p50_ms``/``_p95``: a submission's latency as the client saw it, its retries included;
  ``submit_retries``: POSTs sent again after a transport error or a ``429`` (its ``Retry-After`` waited).
- ``e2e_p50_ms``/``_p95``: submit → succeeded, ``finished_at - created_at`` (the server's clock, so polling
  adds nothing). With every run submitted at once this is mostly waiting for a worker: ``queue_wait_*``.
- ``exec_p50_ms``/``_p95``: ``finished_at - started_at``, a worker's time for one run from its claim to its
  stored outcome.
- ``tool_p50_ms``: the tool's own time in a run: the sum of its tool calls' ``latency_ms`` as the gate measured
  them (the MCP round trip over the pooled session and the server's work; the timings' ``deterministic_ms`` and
  ``tools_ms`` contain it too). It is the part of a run that is not the platform's.
- ``platform_exec_p50_ms``: ``exec - tool`` per run: claim, lease and heartbeat, events, rule evaluation,
  contract checks, audit, storing.
- ``platform_share_exec``: Σ(exec - tool) / Σ exec — the platform's share of the workers' time;
  ``platform_share_e2e``: Σ(e2e - tool) / Σ e2e — its share of what callers waited, queueing included.
- ``runs_finished_twice``: runs with more than one terminal status event (must be 0); ``write_calls_twice``:
  (run, call) pairs of a write tool whose call succeeded more than once in the audit record (must be 0: a write
  runs at most once, even when its worker dies), out of ``write_calls_checked`` such pairs (0 without
  ``--write-every``; with it, 0 is an error); ``read_calls_repeated``: the same for read tools, which a run
  taken over from a dead worker may call again (its first worker's results died with it);
  ``reads_repeated_outside_taken_over_runs``: repeated reads in runs claimed once (must be 0);
  ``runs_claimed_again``: runs claimed by a second delivery (the killed worker's run, with ``--kill-midway``; a
  run resumed after an approval starts its deliveries afresh, and is not counted).
- ``cpu_ms_per_run_<part>`` (Linux): the CPU time each part of the machine spent from the first submission to the
  last run's end, per succeeded run (``bench/_cpu.py``): ``client`` (this process: the submitting and polling
  threads), ``web``, ``workers``, ``mcp_servers``, ``redis``, ``postgres``, ``other`` (the benchmark's own
  processes only), ``outside`` (every other process on the machine: another session's server or test suite, not
  the platform's cost), ``machine`` (every core's busy time) and ``unaccounted`` (machine minus the parts).
  ``runs_per_second_at_full_cpu``: ``cpu_cores`` / the machine's CPU per run without ``outside``, the rate these
  costs allow on this machine with every core busy: when it is close to ``runs_per_second``, the machine's CPU is
  the bound, and only a cheaper part (or more cores) raises the rate; a large ``outside`` means the machine was
  shared while it ran (the rate is then the shared machine's).
- ``runs_per_second``: succeeded runs / (last ``finished_at`` - first ``created_at``).
- Percentiles interpolate between the closest samples (``bench/_stats.py``: a p50 is the median).
- ``runs_per_second_over_at_full_cpu`` (the headline, last; Linux): ``runs_per_second`` /
  ``runs_per_second_at_full_cpu``, both from this run: near 1, the machine's CPU is the bound; well below, the
  runs waited on something else (a lock, the broker, a worker's turn).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench._cpu import CpuWindow, pids_with
from bench._stats import non_negative_int, percentile, positive_int

QUESTIONS = [
    "김하늘 님은 어느 팀 소속인가요?",
    "클라우드운영팀 인원이 몇 명인지 알려주세요.",
    "물류플랫폼팀 프로젝트 알려줘",
    "김하늘 님 보유 자산 알려줘",
]
FINISHED = {"succeeded", "failed", "cancelled"}
# Seed 001's multi_tool arithmetic: the demo's rule calls the local ``calculate``, which ``--write-every`` marks a
# write tool (its calls then wait for an approval that the benchmark gives, as the run's API caller).
WRITE_QUESTION = "48건이 12% 늘면 몇 건인지 계산해줘."
WRITE_TOOL = ("local", "calculate")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(name: str, value: float | int, digits: int = 2) -> None:
    print(f"{name}: {round(value, digits) if isinstance(value, float) else value}", flush=True)


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def query_of(i: int, write_every: int) -> str:
    """The query of the ``i``-th run: every ``write_every``-th one (0: none) calls the write tool, the others ask
    the seed's questions in turn."""
    if write_every and i % write_every == write_every - 1:
        return WRITE_QUESTION
    return QUESTIONS[i % len(QUESTIONS)]


def submit_all(
    client: httpx.Client, runs: int, clients: int, *, write_every: int = 0
) -> tuple[list[str], list[float], int]:
    """Submit ``runs`` runs from ``clients`` threads released together. Returns the run ids, each submission's
    milliseconds (its retries and their pauses included) and the retries in all (transport errors, 429s)."""
    release = threading.Event()

    def submit(i: int) -> tuple[str, float, int]:
        release.wait()
        # An Idempotency-Key per submission: a POST retried after a dropped connection (a keep-alive connection
        # the server closed as it was reused, under load) answers with the run it created, never a second run.
        key = {"Idempotency-Key": f"bench-load-{uuid.uuid4()}"}
        t0 = time.perf_counter()
        for attempt in range(20):
            try:
                response = client.post(
                    "/api/v1/runs",
                    json={"agent": "company-assistant", "query": query_of(i, write_every)},
                    headers=key,
                )
            except httpx.TransportError:
                time.sleep(0.5)
                continue
            if response.status_code in (200, 202):
                return str(response.json()["id"]), (time.perf_counter() - t0) * 1000, attempt
            if response.status_code != 429:
                raise RuntimeError(f"submit {i}: {response.status_code} {response.text[:200]}")
            time.sleep(float(response.headers.get("Retry-After", "1")))
        raise RuntimeError(f"submit {i}: throttled 20 times")

    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(submit, i) for i in range(runs)]
        release.set()
        done = [f.result() for f in futures]
    return [run_id for run_id, _, _ in done], [ms for _, ms, _ in done], sum(retries for _, _, retries in done)


def approve_pending(client: httpx.Client, body: dict[str, Any]) -> None:
    """Approve, as the run's API caller, the pending approvals of a run that waits for them (the write tool's
    calls, asked for by a rule: the caller may approve them)."""
    for approval in body.get("approvals") or []:
        if approval.get("status") != "pending":
            continue
        with contextlib.suppress(httpx.TransportError):
            # A 409 (decided meanwhile, or the run finished) leaves nothing to do: the next poll sees the run.
            client.post(f"/api/v1/runs/{body['id']}/approvals/{approval['id']}", json={"decision": "approve"})


def poll_until_finished(
    client: httpx.Client,
    run_ids: list[str],
    timeout: float,
    on_progress: Any = None,
) -> dict[str, dict[str, Any]]:
    """Each finished run's final body (a run not finished by ``timeout`` is left out). Runs are taken in
    submission order (the queue is first in, first out), so by the time one is asked about, most after it have
    finished too: about one GET per run. Timestamps come from the server, so how often this asks changes no
    figure. A run that waits for an approval has it approved (``approve_pending``)."""
    finished: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    shown = -1  # the count last shown: a line each time it reaches a hundred more, and one at the end
    for run_id in run_ids:
        while time.monotonic() < deadline:
            try:
                body = client.get(f"/api/v1/runs/{run_id}").json()
            except httpx.TransportError:
                time.sleep(0.5)
                continue
            if body.get("status") in FINISHED:
                finished[run_id] = body
                break
            if body.get("status") == "awaiting_approval":
                approve_pending(client, body)
            time.sleep(0.2)
        if len(finished) != shown and len(finished) % 100 == 0:
            shown = len(finished)
            progress(f"  {shown}/{len(run_ids)} finished")
        if on_progress is not None:
            on_progress(len(finished))
    if len(finished) != shown:
        progress(f"  {len(finished)}/{len(run_ids)} finished")
    return finished


def outcomes(run_ids: list[str], finished: dict[str, dict[str, Any]]) -> dict[str, int]:
    """How the runs ended: ``succeeded``, ``lost`` (every other run), and of those ``failed``, ``cancelled`` and
    ``unfinished`` (still queued, running or waiting for an approval when the benchmark stopped waiting)."""
    statuses = [finished.get(run_id, {}).get("status") for run_id in run_ids]
    succeeded = statuses.count("succeeded")
    return {
        "succeeded": succeeded,
        "lost": len(run_ids) - succeeded,
        "failed": statuses.count("failed"),
        "cancelled": statuses.count("cancelled"),
        "unfinished": sum(1 for status in statuses if status not in FINISHED),
    }


TWICE_CHECK = """
import json, sys
from collections import Counter
from agents.models import RunEvent
from audit.models import AuditEvent
from audit.services import audit_chain_pending
audit_chain_pending(wait=True, rounds=None)  # what a killed writer left pending, or a worker's chainer holds, joins the record first
ids = json.load(open({path!r}))
terminal, later_deliveries = Counter(), Counter()
statuses = RunEvent.objects.filter(run_id__in=ids, kind="status")
for run_id, status, delivery in statuses.values_list("run_id", "data__status", "data__delivery"):
    if status in ("succeeded", "failed", "cancelled"):
        terminal[run_id] += 1
    elif status == "running" and int(delivery or 1) > 1:  # a run resumed after an approval is delivery 1 again
        later_deliveries[run_id] += 1
from mcpregistry.models import ToolContract
writes = set(
    ToolContract.objects.exclude(risk=ToolContract.Risk.READ).values_list("tool__server__mcp_id", "tool__name")
)
calls = Counter(
    AuditEvent.objects.filter(run_id__in=ids, action="tool.call", ok=True).values_list(
        "run_id", "source", "mcp_id", "tool", "call_id"
    )
)
twice = [key for key, n in calls.items() if n > 1]
print(json.dumps({{
    "runs_finished_twice": sum(1 for n in terminal.values() if n > 1),
    "write_calls_checked": sum(1 for key in calls if (key[2], key[3]) in writes),
    "write_calls_twice": sum(1 for key in twice if (key[2], key[3]) in writes),
    "read_calls_repeated": sum(1 for key in twice if (key[2], key[3]) not in writes),
    "reads_repeated_outside_taken_over_runs": sum(
        1 for key in twice if (key[2], key[3]) not in writes and not later_deliveries[key[0]]
    ),
    "runs_claimed_again": len(later_deliveries),
}}, default=str))
"""


MARK_WRITE = """
from mcpregistry.models import ToolContract
from mcpregistry.services import tool_contract_update
contract = ToolContract.objects.get(tool__server__mcp_id={mcp_id!r}, tool__name={tool!r})
tool_contract_update(contract=contract, actor="system:bench", via="bench", data={{"risk": ToolContract.Risk.WRITE}})
"""


def twice_check(platform: Any, run_ids: list[str], workdir: Path) -> dict[str, int]:
    """Runs that finished twice and tool calls that succeeded twice, read from the database."""
    import json

    path = workdir / "run_ids.json"
    path.write_text(json.dumps(run_ids), encoding="utf-8")
    out = platform.manage("shell", "-c", TWICE_CHECK.format(path=str(path)))
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=500)
    parser.add_argument("--clients", type=positive_int, default=100, help="submitting threads")
    parser.add_argument("--web", choices=["gunicorn", "uvicorn", "runserver"], default="gunicorn")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds to wait for the runs to finish")
    parser.add_argument(
        "--postgres", action="store_true", help="a private PostgreSQL cluster (tests.postgres) instead of SQLite"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working folder (database, logs)")
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes (--concurrency=1 each)")
    parser.add_argument(
        "--kill-midway",
        action="store_true",
        help="SIGKILL one worker once half of the runs finished, and start a replacement",
    )
    parser.add_argument(
        "--write-every",
        type=non_negative_int,
        default=0,
        help="every N-th run calls a write tool, approved by the benchmark (default 0: none)",
    )
    options = parser.parse_args()

    from tests.e2e.harness import redis_server
    from tests.e2e.workers import platform_without_workers

    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        database_url = ""
        if options.postgres:
            from tests.postgres import private_postgres

            database_url = stack.enter_context(private_postgres())
        broker_url = stack.enter_context(redis_server(workdir))
        platform = stack.enter_context(
            platform_without_workers(
                workdir,
                broker_url=broker_url,
                database_url=database_url,
                env={
                    "PLATFORM_API_RATE": "1000000/min",
                    "LOG_LEVEL": "WARNING",
                    **(
                        {"PLATFORM_RUN_LEASE_S": "3", "PLATFORM_RECONCILE_INTERVAL_S": "1"}
                        if options.kill_midway
                        else {}
                    ),
                },
                web=options.web,
            )
        )
        if options.write_every:
            platform.manage("shell", "-c", MARK_WRITE.format(mcp_id=WRITE_TOOL[0], tool=WRITE_TOOL[1]))
        progress(f"platform up in {time.monotonic() - started:.1f} s ({workdir}); starting {options.workers} workers")
        for n in range(options.workers):
            platform.start_worker(f"w{n + 1}", wait=False)
        for worker in platform.workers:
            worker.wait_ready()
        limits = httpx.Limits(max_connections=options.clients, max_keepalive_connections=options.clients)
        with platform.client(limits=limits, timeout=120) as client:
            # Two runs first (one per worker, as a rule): they open the pooled MCP sessions a running worker has.
            warm, _, _ = submit_all(client, 2, 2)
            poll_until_finished(client, warm, 60)
            progress(f"submitting {options.runs} runs from {options.clients} threads")
            # The PostgreSQL server detaches from its starter: named as the benchmark's own by its port.
            roots = pids_with("postgres", "-p", str(urlsplit(database_url).port)) if database_url else frozenset()
            cpu = CpuWindow(roots=roots) if CpuWindow.available() else None
            if cpu is not None:
                cpu.start()
            t0 = time.monotonic()
            run_ids, submit_ms, submit_retries = submit_all(
                client, options.runs, options.clients, write_every=options.write_every
            )
            progress(f"  submitted in {time.monotonic() - t0:.1f} s")
            killed: list[str] = []

            def kill_midway(done: int) -> None:
                if options.kill_midway and not killed and done >= options.runs // 2:
                    victim = platform.workers[0]
                    progress(f"  {done} finished: SIGKILL to worker {victim.name}, starting a replacement")
                    victim.kill()
                    killed.append(victim.name)
                    platform.start_worker(f"{victim.name}-again", wait=False)

            finished = poll_until_finished(client, run_ids, options.timeout, on_progress=kill_midway)
        wall_s = time.monotonic() - t0
        cpu_spent = cpu.stop() if cpu is not None else {}
        twice = twice_check(platform, run_ids, workdir)

    counts = outcomes(run_ids, finished)
    report("workers", options.workers)
    report("workers_killed", len(killed))
    report("runs", len(run_ids))
    for name, count in counts.items():
        report(name, count)
    report("wall_s", wall_s)
    report("submit_retries", submit_retries)
    if not counts["succeeded"]:
        for name, value in twice.items():
            report(name, value)
        progress(f"no run succeeded; logs and database kept in {workdir}")
        sys.exit(1)
    succeeded = [finished[r] for r in run_ids if finished.get(r, {}).get("status") == "succeeded"]
    lost = counts["lost"]
    e2e, queue, execution, tool, platform_exec = [], [], [], [], []
    for run in succeeded:
        created, started_at, done = when(run["created_at"]), when(run["started_at"]), when(run["finished_at"])
        tool_ms = sum(call["latency_ms"] or 0.0 for call in run["tool_calls"])
        e2e.append((done - created).total_seconds() * 1000)
        queue.append((started_at - created).total_seconds() * 1000)
        execution.append((done - started_at).total_seconds() * 1000)
        tool.append(tool_ms)
        platform_exec.append(execution[-1] - tool_ms)
    first = min(when(r["created_at"]) for r in succeeded)
    last = max(when(r["finished_at"]) for r in succeeded)

    report("submit_p50_ms", percentile(submit_ms, 0.5))
    report("submit_p95_ms", percentile(submit_ms, 0.95))
    report("e2e_p50_ms", percentile(e2e, 0.5))
    report("e2e_p95_ms", percentile(e2e, 0.95))
    report("queue_wait_p50_ms", percentile(queue, 0.5))
    report("exec_p50_ms", percentile(execution, 0.5))
    report("exec_p95_ms", percentile(execution, 0.95))
    report("tool_p50_ms", percentile(tool, 0.5))
    report("platform_exec_p50_ms", percentile(platform_exec, 0.5))
    report("platform_share_exec", sum(platform_exec) / sum(execution), 3)
    report("platform_share_e2e", (sum(e2e) - sum(tool)) / sum(e2e), 4)
    report("mean_tool_calls_per_run", statistics.mean(len(r["tool_calls"]) for r in succeeded))
    for name, value in twice.items():
        report(name, value)
    if cpu_spent and succeeded:
        # The machine's CPU per run, by part: the rate this machine can give is at most cores / machine's CPU per
        # run, whatever the platform does (bench/_cpu.py).
        for part, seconds in cpu_spent.items():
            report(f"cpu_ms_per_run_{part}", seconds / len(succeeded) * 1000)
        cores = os.cpu_count() or 1
        report("cpu_cores", cores)
        own = cpu_spent["machine"] - cpu_spent["outside"]
        at_full_cpu = cores / (own / len(succeeded))
        report("runs_per_second_at_full_cpu", at_full_cpu)
    runs_per_second = len(succeeded) / (last - first).total_seconds()
    report("runs_per_second", runs_per_second)
    if cpu_spent and succeeded:
        # The headline: the rate reached over the rate this run's CPU costs allow (1.0: the machine's CPU is the
        # bound), both measured in this run.
        report("runs_per_second_over_at_full_cpu", runs_per_second / at_full_cpu, 3)
    broken = (
        lost
        or twice["runs_finished_twice"]
        or twice["write_calls_twice"]
        or twice["reads_repeated_outside_taken_over_runs"]
        or (options.write_every and not twice["write_calls_checked"])  # the write check would have checked nothing
    )
    if options.keep or broken:
        progress(f"logs and database kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if broken:
        sys.exit(1)


if __name__ == "__main__":
    main()
