"""The Celery application. Workers start with ``celery -A agent_platform worker``.

Every worker also runs the run reconciler (``agents.reconciler``) on a timer thread in its main process, so a
setup without ``celery beat`` — the embedded ``filesystem://`` broker on one machine, or any number of workers
— still re-queues runs of lost workers, re-dispatches lost messages, enforces time limits and expires
approvals. ``celery beat`` may run it too (the ``reconcile-runs`` entry below); the reconciler is
compare-and-swap throughout, so running it in several places at once is safe.
``PLATFORM_RECONCILE_IN_WORKER=0`` turns the worker's timer off (e.g. where beat runs it).
"""

from __future__ import annotations

import logging
import os
import random
import threading

from celery import Celery
from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown

from agent_platform.settings_deploy import PLATFORM_RECONCILE_INTERVAL_S

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

logger = logging.getLogger(__name__)

app = Celery("agent_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.conf.beat_schedule = {
    "reconcile-runs": {
        "task": "agents.reconcile_runs",
        "schedule": PLATFORM_RECONCILE_INTERVAL_S,
        # A pass that waited longer than its period is superseded by the next one.
        "options": {"expires": PLATFORM_RECONCILE_INTERVAL_S},
    }
}


@worker_shutdown.connect
@worker_process_shutdown.connect
def _close_mcp_sessions(**_kwargs: object) -> None:
    """Close every pooled MCP session (and so every stdio server process) when a worker stops."""
    from mcpregistry.pool import shutdown_default_pool

    shutdown_default_pool()


class WorkerReconciler:
    """Runs ``runs_reconcile`` every ``interval_s`` (± 10 %, so that workers started together spread out) on a
    daemon thread of the worker's main process, starting at once, and sooner when the earliest lease of a running
    run falls due before that (``runs_next_lease_due``): a run whose worker died is taken over about as soon as
    its lease lapses, not up to a whole interval later. Healthy runs renew their leases a third of the way
    through, so they never bring a pass forward. A failing pass is logged and the next one runs on time.

    The main process forks pool processes (at start, and to replace one that died), and a database connection
    must not cross a fork (a SQLite connection's lock state, a PostgreSQL socket): each pass opens its own
    connection and closes it, and holds ``pass_lock``, which a fork waits for (``os.register_at_fork``)."""

    pass_lock = threading.Lock()

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="run-reconciler", daemon=True)

    def start(self) -> None:
        os.register_at_fork(
            before=self.pass_lock.acquire,
            after_in_parent=self.pass_lock.release,
            after_in_child=self.pass_lock.release,
        )
        self.thread.start()

    def _loop(self) -> None:
        from django.db import connection

        from agents.reconciler import runs_next_lease_due_in_s, runs_reconcile

        while not self.stop.is_set():
            wait_s = self.interval_s * random.uniform(0.9, 1.1)  # noqa: S311 - spreading, not security
            with self.pass_lock:
                try:
                    runs_reconcile()
                    due_in_s = runs_next_lease_due_in_s()
                    if due_in_s is not None:
                        wait_s = min(wait_s, max(due_in_s + LEASE_DUE_MARGIN_S, MIN_PASS_GAP_S))
                except Exception:  # the next pass must still run
                    logger.exception("a reconciler pass failed")
                finally:
                    connection.close()
            self.stop.wait(wait_s)


# A pass brought forward by a lease runs this long after the lease is due (the database's clock and ours), and
# never sooner than MIN_PASS_GAP_S after the previous pass.
LEASE_DUE_MARGIN_S = 0.25
MIN_PASS_GAP_S = 0.5

_reconciler: WorkerReconciler | None = None


@worker_ready.connect
def _start_reconciler(**_kwargs: object) -> None:
    from agents.dispatch import lifecycle_setting

    global _reconciler
    interval_s = float(lifecycle_setting("PLATFORM_RECONCILE_INTERVAL_S"))
    if not lifecycle_setting("PLATFORM_RECONCILE_IN_WORKER") or interval_s <= 0 or _reconciler is not None:
        return
    _reconciler = WorkerReconciler(interval_s)
    _reconciler.start()
    logger.info("run reconciler started in this worker (every %g s)", interval_s)


@worker_shutdown.connect
def _stop_reconciler(**_kwargs: object) -> None:
    if _reconciler is not None:
        _reconciler.stop.set()
        _reconciler.thread.join(timeout=10)
