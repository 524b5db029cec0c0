"""The Celery application. Workers start with ``celery -A agent_platform worker``.

Every worker also runs the run reconciler (``agents.reconciler``) on a timer thread in its main process, so a
setup without ``celery beat`` — the embedded ``filesystem://`` broker on one machine, or any number of workers
— still re-queues runs of lost workers, re-dispatches lost messages, enforces time limits and expires
approvals. ``celery beat`` may run it too (the ``reconcile-runs`` entry below); the reconciler is
compare-and-swap throughout, so running it in several places at once is safe.
``PLATFORM_RECONCILE_IN_WORKER=0`` turns the worker's timer off (e.g. where beat runs it).

Every worker also anchors the audit chain's head outside the database (``audit.anchors``) every
``AUDIT_ANCHOR_INTERVAL_S`` seconds (0 turns it off), on a second timer thread.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable

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


class WorkerTimer:
    """Runs ``job`` every ``interval_s`` (± 10 %, so that workers started together spread out) on a daemon
    thread of the worker's main process, starting at once. A job may return the seconds until it is next due,
    when that is sooner (the reconciler: the earliest lease of a running run), and the timer wakes then, never
    sooner than ``MIN_PASS_GAP_S`` after the previous pass. A failing pass is logged and the next one runs on
    time.

    The main process forks pool processes (at start, and to replace one that died), and a database connection
    must not cross a fork (a SQLite connection's lock state, a PostgreSQL socket): each pass opens its own
    connection and closes it, and holds ``pass_lock``, shared by every timer, which a fork waits for
    (``os.register_at_fork``, registered once)."""

    pass_lock = threading.Lock()
    _fork_guarded = False

    def __init__(self, name: str, interval_s: float, job: Callable[[], float | object | None]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.job = job
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        if not WorkerTimer._fork_guarded:
            os.register_at_fork(
                before=self.pass_lock.acquire,
                after_in_parent=self.pass_lock.release,
                after_in_child=self.pass_lock.release,
            )
            WorkerTimer._fork_guarded = True
        self.thread.start()

    def _loop(self) -> None:
        from django.db import connection

        while not self.stop.is_set():
            wait_s = self.interval_s * random.uniform(0.9, 1.1)  # noqa: S311 - spreading, not security
            with self.pass_lock:
                try:
                    due_in_s = self.job()
                    if isinstance(due_in_s, int | float) and not isinstance(due_in_s, bool):
                        wait_s = min(wait_s, max(float(due_in_s) + LEASE_DUE_MARGIN_S, MIN_PASS_GAP_S))
                except Exception:  # the next pass must still run
                    logger.exception("a %s pass failed", self.name)
                finally:
                    connection.close()
            self.stop.wait(wait_s)


# A pass brought forward by a lease runs this long after the lease is due (the database's clock and ours), and
# never sooner than MIN_PASS_GAP_S after the previous pass.
LEASE_DUE_MARGIN_S = 0.25
MIN_PASS_GAP_S = 0.5


def _reconcile() -> float | None:
    """One reconciler pass; returns the seconds until the earliest lease of a running run falls due (a run whose
    worker died is then taken over about as soon as its lease lapses, not up to a whole interval later)."""
    from agents.reconciler import runs_next_lease_due_in_s, runs_reconcile

    runs_reconcile()
    return runs_next_lease_due_in_s()


_reconciler: WorkerTimer | None = None
_anchor_timer: WorkerTimer | None = None


@worker_ready.connect
def _start_reconciler(**_kwargs: object) -> None:
    from agents.dispatch import lifecycle_setting

    global _reconciler
    interval_s = float(lifecycle_setting("PLATFORM_RECONCILE_INTERVAL_S"))
    if not lifecycle_setting("PLATFORM_RECONCILE_IN_WORKER") or interval_s <= 0 or _reconciler is not None:
        return
    _reconciler = WorkerTimer("run-reconciler", interval_s, _reconcile)
    _reconciler.start()
    logger.info("run reconciler started in this worker (every %g s)", interval_s)


@worker_ready.connect
def _start_audit_anchor(**_kwargs: object) -> None:
    """Anchor the audit chain's head outside the database every ``AUDIT_ANCHOR_INTERVAL_S`` (0: off), when it
    moved (``audit.anchors.AnchorTimer``). A head that cannot be anchored (missing, forged) is logged as an error
    on every pass."""
    from django.conf import settings

    from audit.anchors import AnchorTimer

    global _anchor_timer
    interval_s = float(settings.AUDIT_ANCHOR_INTERVAL_S)
    if interval_s <= 0 or _anchor_timer is not None:
        return
    _anchor_timer = WorkerTimer("audit-anchor", interval_s, AnchorTimer())
    _anchor_timer.start()
    logger.info("audit anchor started in this worker (every %g s)", interval_s)


@worker_shutdown.connect
def _stop_timers(**_kwargs: object) -> None:
    for timer in (_reconciler, _anchor_timer):
        if timer is not None:
            timer.stop.set()
            timer.thread.join(timeout=10)
