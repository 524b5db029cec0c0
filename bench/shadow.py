"""Shadow overhead: what shadowing live runs adds to the caller's latency, through real workers.

Run from the repo root: ``python -m bench.shadow [--runs 100]``.

It starts the platform as ``tests/e2e`` does (``tests.e2e.workers``): its own SQLite file, a private
``redis-server`` as the broker, migrate, ``seed_demo``, an API key, the web server, a worker for live runs
(``--concurrency=1``) and a worker for the shadow queue (``PLATFORM_SHADOW_QUEUE=shadow``). The demo agent is
published (v1) and shadowed on a twin candidate, v2, which differs only in a system prompt the offline model
never reads (the same work again, on the same machine; a run is never shadowed on the version it ran). Callers submit the seed's
questions one after another; each run is polled until it has finished (in the database: polling the API would
hit the key's rate limit).

- **Randomized** (the headline): the sample rate is 0.5, so the platform's own coin decides which live runs get
  a shadow; sampled and unsampled runs interleave in time, and the machine's drift falls on both alike. The next
  caller comes once the previous caller's shadow (if any) has been compared: what a shadow adds to its own
  caller's run. Runs continue until both groups have ``--runs``.
- **Back to back**: every run shadowed (rate 1), the next caller at once: the previous caller's shadow runs
  beside this caller's run, and on a machine short of cores they compete.

Figures (``name: value`` lines, the last is the headline ratio):

- ``caller_p50_ms_without_shadow`` / ``_with_shadow`` / ``_with_shadow_back_to_back``: the caller's latency,
  submit → finished (``finished_at - created_at``, the server's clock, so polling adds nothing);
- ``runs_sampled`` / ``runs_not_sampled``; ``runs_failed``: runs that did not succeed within a minute, left out of
  every median (the bench then exits 1); ``late_shadows``: unsampled runs whose shadow appeared only after the
  bench had classified them (they would have run beside the next caller; 0 expected);
- ``shadows_started`` / ``shadows_compared``: shadow runs made and comparisons stored (equal at the end);
- ``shadow_added_latency_ms_p50_back_to_back``: back-to-back median minus the unsampled median;
- ``shadow_added_latency_ms_p50_unstratified``: sampled median minus unsampled median;
- ``shadow_added_latency_ms_p50``: the same per question (the seed's questions differ in latency, and the coin
  need not split them evenly), averaged over the questions (target ≤ 2 ms). By construction the
  shadow is created only after the caller's outcome is stored, so it cannot lengthen that run; the figure
  shows what the machine's noise leaves of that.
- ``caller_p50_with_shadow_over_without`` (the headline, last): ``caller_p50_ms_with_shadow`` /
  ``caller_p50_ms_without_shadow``, the sampled runs' median over the unsampled ones', both from the randomized
  part of this run (1.0: a shadow adds nothing to its own caller's run).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

from bench._stats import median, positive_int

QUESTIONS = [
    "김하늘 님은 어느 팀 소속인가요?",
    "클라우드운영팀 인원이 몇 명인지 알려주세요.",
    "A-1001 자산의 현재 상태를 알려주세요.",
    "김하늘 님 보유 자산 알려줘",
]


# How long after a live run has finished its shadow (if sampled) surely exists: the live worker creates it right
# after storing the outcome, in the same task.
SAMPLING_SETTLE_S = 0.1


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(name: str, value: float | int, digits: int = 2) -> None:
    print(f"{name}: {round(value, digits) if isinstance(value, float) else value}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--runs", type=positive_int, default=100, help="runs per condition (sampled, not sampled, back to back)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs, database)")
    options = parser.parse_args()

    from tests.e2e.harness import publish_with_twin_candidate, redis_server, wait_until
    from tests.e2e.workers import platform_without_workers

    workdir = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    conditions = ("off", "on", "on_back_to_back")
    latencies: dict[str, list[float]] = {c: [] for c in conditions}
    queue_waits: dict[str, list[float]] = {c: [] for c in ("randomized", "on_back_to_back", "warm-up")}
    with ExitStack() as stack:
        broker_url = stack.enter_context(redis_server(workdir))
        platform = stack.enter_context(
            platform_without_workers(
                workdir,
                broker_url=broker_url,
                env={"PLATFORM_SHADOW_QUEUE": "shadow", "PLATFORM_API_RATE": "1000000/min"},
            )
        )
        candidate = publish_with_twin_candidate(platform.manage)
        progress(f"platform up ({workdir}); starting the live and the shadow worker")
        platform.start_worker("live", wait=False)
        platform.start_worker("shadow", queues="shadow", wait=False)
        for worker in platform.workers:  # started together, waited for together
            worker.wait_ready()
        client = stack.enter_context(platform.client())

        def compared() -> int:
            return int(platform.query("SELECT COUNT(*) FROM agents_shadowcomparison")[0][0])

        failed: list[str] = []

        def caller_ms(query: str, condition: str) -> tuple[str, float | None]:
            """The run and its caller's milliseconds; None for a run that did not succeed within a minute (it is
            counted in ``runs_failed``, and left out of every median)."""
            run_id = client.post("/api/v1/runs", json={"agent": "company-assistant", "query": query}).json()["id"]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the database, not the API: polling would hit the rate limit
                if platform.run_row(run_id)["status"] in {"succeeded", "failed", "cancelled"}:
                    break
                time.sleep(0.02)
            row = platform.run_row(run_id)
            if row["status"] != "succeeded":
                progress(f"  run {run_id} ({condition}) ended {row['status']}")
                failed.append(run_id)
                return run_id, None
            created = datetime.fromisoformat(str(row["created_at"]))
            started = datetime.fromisoformat(str(row["started_at"]))
            finished = datetime.fromisoformat(str(row["finished_at"]))
            queue_waits[condition].append((started - created).total_seconds() * 1000)
            return run_id, (finished - created).total_seconds() * 1000

        # Warm-up: both workers open their MCP sessions (a shadowed run).
        progress("warming both workers' MCP sessions")
        platform.manage("agent_version", "shadow", "company-assistant", candidate, "--rate", "1")
        for query in QUESTIONS:
            caller_ms(query, "warm-up")
        wait_until(lambda: compared() >= len(QUESTIONS), timeout=120, what="the warm-up shadows")

        def shadow_of(run_id: str) -> str | None:
            rows = platform.query("SELECT id FROM agents_run WHERE shadow_of_id = ?", run_id.replace("-", ""))
            return str(rows[0][0]) if rows else None

        def comparison_stored(run_id: str) -> bool:
            return bool(
                platform.query("SELECT 1 FROM agents_shadowcomparison WHERE live_run_id = ?", run_id.replace("-", ""))
            )

        # Randomized: half of the live runs are sampled for a shadow (rate 0.5, the platform's own coin), so
        # sampled and unsampled runs interleave in time and the machine's drift falls on both alike. The next
        # caller comes once the previous caller's shadow (if any) has been compared.
        progress(f"randomized: until {options.runs} runs sampled and {options.runs} not")
        platform.manage("agent_version", "shadow", "company-assistant", candidate, "--rate", "0.5")
        unsampled: list[str] = []
        by_question: dict[str, list[list[float]]] = {g: [[] for _ in QUESTIONS] for g in ("on", "off")}
        made = 0
        while min(len(latencies["off"]), len(latencies["on"])) < options.runs and made < 8 * options.runs:
            run_id, elapsed = caller_ms(QUESTIONS[made % len(QUESTIONS)], "randomized")
            made += 1
            time.sleep(SAMPLING_SETTLE_S)  # the live worker starts the shadow right after storing the outcome
            asked = (made - 1) % len(QUESTIONS)
            if elapsed is None:
                continue
            if shadow_of(run_id) is None:
                latencies["off"].append(elapsed)
                by_question["off"][asked].append(elapsed)
                unsampled.append(run_id)
            else:
                latencies["on"].append(elapsed)
                by_question["on"][asked].append(elapsed)
                wait_until(lambda run_id=run_id: comparison_stored(run_id), timeout=60, what="the shadow")
        # A shadow that appeared after the settle pause would have run beside the next caller: count them.
        late = sum(1 for run_id in unsampled if shadow_of(run_id) is not None)
        # Back to back: every run shadowed, the next caller at once (its run competes with the previous shadow).
        progress(f"back to back: {options.runs} runs, every one shadowed")
        platform.manage("agent_version", "shadow", "company-assistant", candidate, "--rate", "1")
        wait_until(
            lambda: compared() >= int(platform.query("SELECT COUNT(*) FROM agents_run WHERE purpose = 'shadow'")[0][0]),
            timeout=120,
            what="the earlier shadows",
        )
        for _ in range(options.runs):
            _, elapsed = caller_ms(QUESTIONS[made % len(QUESTIONS)], "on_back_to_back")
            if elapsed is not None:
                latencies["on_back_to_back"].append(elapsed)
            made += 1
        shadows = int(platform.query("SELECT COUNT(*) FROM agents_run WHERE purpose = 'shadow'")[0][0])
        try:
            wait_until(lambda: compared() >= shadows, timeout=120, what="the shadow comparisons")
        except AssertionError as exc:
            progress(str(exc))
        stored = compared()
    without = median(latencies["off"])
    report("runs_sampled", len(latencies["on"]))
    report("runs_not_sampled", len(latencies["off"]))
    report("late_shadows", late)
    report("runs_failed", len(failed))
    report("caller_p50_ms_without_shadow", without)
    report("caller_p50_ms_with_shadow", median(latencies["on"]))
    report("caller_p50_ms_with_shadow_back_to_back", median(latencies["on_back_to_back"]))
    for condition in ("randomized", "on_back_to_back"):
        report(f"queue_wait_p50_ms_{condition}", median(queue_waits[condition]))
    report("shadows_started", shadows)
    report("shadows_compared", stored)
    report("shadow_added_latency_ms_p50_back_to_back", median(latencies["on_back_to_back"]) - without)
    report("shadow_added_latency_ms_p50_unstratified", median(latencies["on"]) - without)
    # Stratified by question (the questions' own latencies differ, and the coin need not split them evenly):
    # the mean over questions of (sampled median - unsampled median).
    pairs = [(on, off) for on, off in zip(by_question["on"], by_question["off"], strict=True) if on and off]
    report("shadow_added_latency_ms_p50", sum(median(on) - median(off) for on, off in pairs) / max(1, len(pairs)))
    report("caller_p50_with_shadow_over_without", median(latencies["on"]) / without, 3)
    if options.keep or failed:
        progress(f"logs and database kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if failed:
        sys.exit(f"{len(failed)} runs did not succeed (runs_failed): the medians leave them out")


if __name__ == "__main__":
    main()
