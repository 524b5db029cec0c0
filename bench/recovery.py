"""Recovery from a lost worker: how long a run whose worker died (SIGKILL, the whole machine) waits before another
worker takes it over, with the lifecycle settings' defaults.

Run from the repo root: ``python -m bench.recovery [--samples 3] [--timeout 420] [--sleep-s 6]``.

It starts the platform as ``tests/e2e`` does (``tests.e2e.workers``): its own SQLite file, a private
``redis-server`` as the broker, migrate, ``seed_demo``, an API key, the web server, and two workers
(``--concurrency=1`` each) with the default ``PLATFORM_RUN_LEASE_S`` and ``PLATFORM_RECONCILE_INTERVAL_S`` (unless
the environment sets them). Each sample submits a run whose scripted model calls the probe server's ``echo``,
then its ``sleep`` (6 s, ``--sleep-s``); one second into the sleep, the worker holding the run is killed with
everything it started. The other worker's reconciler finds the lease lapsed and queues the run again; a worker
claims it. A replacement worker is started before the next sample. Samples stop at ``--samples`` or when
``--timeout`` has passed.

Figures (``name: value`` lines; the last is the headline ratio):

- ``lease_s``, ``reconcile_interval_s``: the settings the workers ran with.
- ``worker_loss_recovery_s_p50`` / ``_max``: from the kill to the second delivery's claim (its ``running``
  status event, the server's clock), over the samples; ``worker_loss_samples``: how many; ``worker_loss_lost``:
  runs that did not succeed in the end (must be 0: the bench exits 1 otherwise, once its figures are printed).
- ``documented_baseline_worker_loss_recovery_s``: the baseline is **not measured in this run**: it is the
  documented figure from before this change (lease 60 s, interval 30 s, no early pass when a lease fell due: the
  same kill was taken over after 89-109 s; the baseline is that range's middle, 99 s; ``--baseline-s`` to change
  it). A line on stderr says so (stdout holds only figures), and ``baseline_measured_in_this_run`` is 0. Why not measured: the old behaviour
  is not reachable by settings (the early pass is code), so the old lease and interval on this code would be
  taken over up to a lease (60 s) after the kill, not after 99 s; and it would cost 70-100 s a sample.
- ``worker_loss_recovery_speedup_vs_documented_baseline`` (the headline, last): documented baseline / p50.

The workers inherit this process's environment: ``PLATFORM_RUN_LEASE_S=3 PLATFORM_RECONCILE_INTERVAL_S=1 python
-m bench.recovery --samples 1`` is a quick check of the path (``tests/test_bench_runs.py``), not the defaults'
figure.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._stats import median, positive_int

SLEEP_S = 6.0
# Documented, not measured in the run: before this change (lease 60 s, interval 30 s, no early pass) the kill was
# taken over after 89-109 s (README, "Runs and workers"); the middle of that range.
DOCUMENTED_BASELINE_S = 99.0


def sleeper(root: Path, sleep_s: float = SLEEP_S) -> dict[str, Any]:
    return {
        "servers": [
            {
                "mcp_id": "probe",
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", "tests.mcp_fixtures.probe_server"],
                "cwd": str(root),
                "session_scope": "per_run",
                "timeout_s": 60,
            }
        ],
        # The admin who binds the probe confirms that its two tools only read (discovery proposes write, and a
        # write call would park the run on an approval), as tests/e2e/test_worker_loss.py does.
        "contracts": [
            {"mcp_id": "probe", "tool": "echo", "args": {"text": {"type": "str", "required": True}}, "risk": "read"},
            {
                "mcp_id": "probe",
                "tool": "sleep",
                "args": {"seconds": {"type": "float", "required": True}},
                "risk": "read",
            },
        ],
        "agents": [
            {
                "slug": "sleeper",
                "servers": ["probe"],
                "model": {
                    "provider": "scripted",
                    "params": {
                        "script": [
                            {"tool_calls": [{"name": "echo", "args": {"text": "warm"}, "id": "call_echo"}]},
                            {"tool_calls": [{"name": "sleep", "args": {"seconds": sleep_s}, "id": "call_sleep"}]},
                            {"content": "done: {last_tool_result}"},
                        ]
                    },
                },
            }
        ],
    }


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(name: str, value: float | int, digits: int = 2) -> None:
    print(f"{name}: {round(value, digits) if isinstance(value, float) else value}", flush=True)


def server_time(text: str) -> float:
    """A timestamp as SQLite stores it (UTC, no zone) → seconds since the epoch."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def one_sample(platform: Any, deadline: float) -> tuple[float, bool]:
    """Submit, kill the holder mid-sleep, measure the takeover. Returns (seconds, whether the run succeeded)."""
    from tests.e2e.harness import wait_until

    with platform.client() as client:
        response = client.post("/api/v1/runs", json={"agent": "sleeper", "query": "잠깐 쉬었다가 답해줘"})
        assert response.status_code == 202, response.text
        run_id = str(response.json()["id"])
    remaining = max(1.0, deadline - time.monotonic())
    wait_until(
        lambda: any("call_sleep" in str(e) for e in platform.run_events(run_id, "model_turn")),
        timeout=min(60, remaining),
        what="the model to call sleep",
    )
    time.sleep(1.0)
    pid = int(platform.run_row(run_id)["worker"].split(":")[1])
    [holder] = [w for w in platform.workers if w.process.poll() is None and pid in w.pool_processes()]
    killed_at = time.time()
    holder.kill()

    def second_claim() -> list[dict[str, Any]]:
        rows = platform.query(
            "SELECT data, created_at FROM agents_runevent WHERE run_id = ? AND kind = 'status' ORDER BY seq",
            run_id.replace("-", ""),
        )
        return [{"data": d, "at": at} for d, at in rows if '"delivery": 2' in d]

    wait_until(lambda: bool(second_claim()), timeout=max(1.0, deadline - time.monotonic()), what="the takeover")
    recovered_s = server_time(second_claim()[0]["at"]) - killed_at
    wait_until(
        lambda: platform.run_row(run_id)["status"] in {"succeeded", "failed", "cancelled"},
        timeout=max(1.0, min(60, deadline - time.monotonic())),
        what="the run to finish",
    )
    return recovered_s, platform.run_row(run_id)["status"] == "succeeded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=positive_int, default=3, help="kills (at most 10)")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds for all the samples together")
    parser.add_argument(
        "--baseline-s",
        type=float,
        default=DOCUMENTED_BASELINE_S,
        help="the documented recovery time before the change (not measured in this run)",
    )
    parser.add_argument(
        "--sleep-s",
        type=float,
        default=SLEEP_S,
        help="the probe's sleep, which the kill interrupts one second in and the second delivery sleeps in full "
        "(more than 1; a quick check of the path may shorten it)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the working folder (database, logs)")
    options = parser.parse_args()
    if options.sleep_s <= 1.0:
        parser.error("argument --sleep-s: must be more than 1 (the kill comes one second into the sleep)")

    from agent_platform import settings_deploy as lifecycle
    from tests.e2e.harness import ROOT, redis_server
    from tests.e2e.workers import platform_without_workers

    workdir = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    recoveries: list[float] = []
    lost = 0
    started = time.monotonic()
    deadline = started + options.timeout
    try:
        with contextlib.ExitStack() as stack:
            broker_url = stack.enter_context(redis_server(workdir))
            platform = stack.enter_context(
                platform_without_workers(
                    workdir, broker_url=broker_url, env={"LOG_LEVEL": "WARNING", "PLATFORM_ALLOW_SCRIPTED_MODEL": "1"}
                )
            )
            platform.import_config(sleeper(ROOT, options.sleep_s))
            platform.manage("mcp_discover", "probe")
            progress(f"platform up in {time.monotonic() - started:.1f} s ({workdir}); starting two workers")
            for name in ("w1", "w2"):
                platform.start_worker(name, wait=False)
            for worker in platform.workers:
                worker.wait_ready()
            for sample in range(1, min(options.samples, 10) + 1):
                if time.monotonic() > deadline - 60:
                    progress("out of time; stopping")
                    break
                seconds, ok = one_sample(platform, deadline)
                recoveries.append(seconds)
                lost += 0 if ok else 1
                progress(f"  sample {sample}: taken over {seconds:.1f} s after the kill")
                if sample < min(options.samples, 10):  # a replacement for the next sample
                    platform.start_worker(f"w{sample + 2}")
    finally:
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    report("lease_s", float(lifecycle.PLATFORM_RUN_LEASE_S))
    report("reconcile_interval_s", float(lifecycle.PLATFORM_RECONCILE_INTERVAL_S))
    report("worker_loss_samples", len(recoveries))
    report("worker_loss_lost", lost)
    if not recoveries:
        raise SystemExit("no sample was taken (--timeout too short?)")
    p50 = median(recoveries)
    report("worker_loss_recovery_s_max", max(recoveries))
    # Said on stderr: stdout holds only ``name: value`` lines, for whoever parses them.
    print(
        "the baseline is the documented pre-change figure (lease 60 s, interval 30 s, no early pass; 89-109 s), "
        "not measured in this run",
        file=sys.stderr,
        flush=True,
    )
    report("baseline_measured_in_this_run", 0)
    report("documented_baseline_worker_loss_recovery_s", options.baseline_s)
    report("worker_loss_recovery_s_p50", p50)
    report("worker_loss_recovery_speedup_vs_documented_baseline", options.baseline_s / p50)
    if lost:
        sys.exit(f"{lost} runs did not succeed after their worker was killed (worker_loss_lost)")


if __name__ == "__main__":
    main()
