"""The queue hop: how long Celery takes from a publish to the start of the task in a worker's pool process, on an
idle machine, against what Redis itself takes to hand a message from one process to another.

Run from the repo root: ``python -m bench.celery_hop [--tasks 200] [--gap-ms 30]``.

A run's ``queue_wait`` (``created_at`` to ``started_at``) and ``bench.latency``'s ``wait_overhead_ms_p50`` contain
this hop whatever the platform does before and after it. The benchmark starts the platform as ``bench.load``
does (``tests.e2e.workers``: a private ``redis-server`` as the broker, the seeded SQLite database) and one worker
as the platform runs them (prefork, ``--concurrency=1``, acks late, prefetch 1), which also imports this module
(``--include``): in the worker, it notes the time of Celery's ``task_received`` (the main process has read the
message from Redis and made the request) and of ``task_prerun`` (the pool process starts the task) in a Redis
hash. It then publishes ``--tasks`` of Celery's built-in no-op task (``celery.accumulate``), one every
``--gap-ms``, with the options a run's task has (its soft and hard time limits), timing each ``send_task``.
The baseline, in the same run: one process ``LPUSH``-es a message with its time to a list that another process
waits on with ``BRPOP``, as a worker's main process waits on the queue.

The baseline pushes as many messages as the Celery side publishes (``--tasks`` and 20 first ones), and both are
measured over the same ``--tasks`` after them.

Figures (``name: value``, ms, medians over the tasks after the first 20): ``send_task_ms_p50`` (the publishing
call, as the web server makes it at a run's commit), ``publish_to_received_ms_p50``, ``received_to_task_start_ms_p50``
(the hand-over to the pool process), ``celery_hop_ms_p50`` (publish to task start), ``redis_hop_ms_p50`` (the
baseline), and last, the headline, ``celery_hop_vs_redis_hop_ratio``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench._stats import positive_int

HOP_REDIS_ENV = "BENCH_CELERY_HOP_REDIS"  # set in the worker's environment: where it notes its times
RECEIVED, STARTED = "bench:celery_hop:received", "bench:celery_hop:started"
WARM = 20  # the first messages of each side, not measured


def _note_in_worker() -> None:
    """In the worker (imported through ``--include``): note each task's receipt and start in Redis."""
    url = os.environ.get(HOP_REDIS_ENV)
    if not url:
        return
    import redis
    from celery.signals import task_prerun, task_received

    local = threading.local()

    def client() -> Any:
        if getattr(local, "pid", None) != os.getpid():  # the pool process is forked: a client of its own
            local.pid, local.client = os.getpid(), redis.Redis.from_url(url)
        return local.client

    @task_received.connect(weak=False)
    def _received(request: Any = None, **_kwargs: Any) -> None:
        client().hset(RECEIVED, request.id, repr(time.time()))

    @task_prerun.connect(weak=False)
    def _started(task_id: str = "", **_kwargs: Any) -> None:
        client().hset(STARTED, task_id, repr(time.time()))


_note_in_worker()


def _redis_hop(url: str, messages: int, gap_s: float) -> list[float]:
    """Milliseconds from an ``LPUSH`` in this process to the ``BRPOP`` of another process returning it."""
    import multiprocessing

    import redis

    key = f"bench:celery_hop:list:{uuid.uuid4()}"
    name = f"bench-celery-hop-popper-{os.getpid()}"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    popper = context.Process(target=_pop, args=(url, key, messages, results, name))
    popper.start()
    client = redis.Redis.from_url(url, decode_responses=True)
    # The popper is waiting: its connection is blocked in BRPOP (Redis's ``b`` flag), as a worker's main process
    # waits on the queue. Asked every 10 ms rather than assumed after a fixed pause.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and popper.is_alive():
        if any(c.get("name") == name and "b" in c.get("flags", "") for c in client.client_list()):
            break
        time.sleep(0.01)
    for _ in range(messages):
        client.lpush(key, repr(time.time()))
        time.sleep(gap_s)
    hops = results.get(timeout=60)
    popper.join(timeout=10)
    return list(hops)


def _pop(url: str, key: str, messages: int, results: Any, name: str) -> None:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True, client_name=name)
    hops = []
    for _ in range(messages):
        popped = client.brpop([key], timeout=30)
        if popped is None:
            break
        hops.append((time.time() - float(popped[1])) * 1000)
    results.put(hops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=positive_int, default=200, help="measured tasks (after 20 not measured)")
    parser.add_argument("--gap-ms", type=float, default=30.0, help="pause between two publishes")
    options = parser.parse_args()
    gap_s = options.gap_ms / 1000

    # Here: the worker imports this module, and needs none of it.
    from bench._stats import median, percentile
    from bench.load import report
    from tests.e2e.harness import redis_server
    from tests.e2e.workers import platform_without_workers

    workdir = Path(tempfile.mkdtemp(prefix="bench-celery-hop-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)  # last, once Redis and the platform are stopped
        broker_url = stack.enter_context(redis_server(workdir))
        platform = stack.enter_context(
            platform_without_workers(workdir, broker_url=broker_url, env={"LOG_LEVEL": "WARNING"})
        )
        platform.start_worker("hop", env={HOP_REDIS_ENV: broker_url}, args=("--include=bench.celery_hop",))
        # As many as the Celery side sends, so that both measure ``--tasks`` after the same warm-up.
        print(f"redis: {options.tasks + WARM} pushes, one every {options.gap_ms} ms…", file=sys.stderr)
        redis_hops = _redis_hop(broker_url, options.tasks + WARM, gap_s)

        for name, value in platform.env.items():
            os.environ[name] = value
        import django

        django.setup()
        import redis
        from celery import current_app

        from agents.dispatch import run_time_limits

        soft, hard = run_time_limits(60)
        print(f"celery: {options.tasks} tasks, one every {options.gap_ms} ms…", file=sys.stderr)
        published: dict[str, tuple[float, float]] = {}
        send_cpu: dict[str, float] = {}
        for i in range(options.tasks + WARM):
            task_id = str(uuid.uuid4())
            t0, c0 = time.time(), time.thread_time()
            current_app.send_task("celery.accumulate", args=[i], task_id=task_id, soft_time_limit=soft, time_limit=hard)
            published[task_id] = (t0, time.time())
            send_cpu[task_id] = (time.thread_time() - c0) * 1000
            time.sleep(gap_s)
        notes = redis.Redis.from_url(broker_url, decode_responses=True)
        deadline = time.monotonic() + 30
        while notes.hlen(STARTED) < len(published) and time.monotonic() < deadline:
            time.sleep(0.1)
        received = {str(k): float(v) for k, v in notes.hgetall(RECEIVED).items()}
        started = {str(k): float(v) for k, v in notes.hgetall(STARTED).items()}

    measured = [task_id for task_id in list(published)[WARM:] if task_id in started and task_id in received]
    if len(measured) < options.tasks:
        sys.exit(f"only {len(measured)} of {options.tasks} tasks were seen starting")
    redis_measured = redis_hops[WARM:]
    if len(redis_measured) < options.tasks:
        sys.exit(f"only {len(redis_measured)} of {options.tasks} Redis pushes were popped")
    send = [(published[t][1] - published[t][0]) * 1000 for t in measured]
    to_received = [(received[t] - published[t][0]) * 1000 for t in measured]
    to_start = [(started[t] - received[t]) * 1000 for t in measured]
    hop = [(started[t] - published[t][0]) * 1000 for t in measured]
    report("send_task_ms_p50", median(send), 3)
    report("send_task_cpu_ms_p50", median(send_cpu[t] for t in measured), 3)
    report("publish_to_received_ms_p50", median(to_received), 3)
    report("received_to_task_start_ms_p50", median(to_start), 3)
    report("celery_hop_ms_p50", median(hop), 3)
    report("celery_hop_ms_p95", percentile(hop, 0.95), 3)
    report("redis_hop_ms_p50", median(redis_measured), 3)
    report("celery_hop_vs_redis_hop_ratio", median(hop) / median(redis_measured), 3)


if __name__ == "__main__":
    main()
