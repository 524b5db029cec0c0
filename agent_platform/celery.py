"""The Celery application. Workers start with ``celery -A agent_platform worker``.

Every worker also runs the run reconciler (``agents.reconciler``) on a timer thread in its main process, so a
setup without ``celery beat`` — the embedded ``filesystem://`` broker on one machine, or any number of workers
— still re-queues runs of lost workers, re-dispatches lost messages, enforces time limits and expires
approvals. ``celery beat`` may run it too (the ``reconcile-runs`` entry below); the reconciler is
compare-and-swap throughout, so running it in several places at once is safe.
``PLATFORM_RECONCILE_IN_WORKER=0`` turns the worker's timer off (e.g. where beat runs it).

Every worker also writes its heartbeat (``agents.WorkerHeartbeat``, for ``/readyz``) every
``PLATFORM_WORKER_HEARTBEAT_S`` seconds (0 turns it off), on a timer thread, while its consumer is connected to the
broker and consuming (``ConsumerConnected``); it removes it while the consumer is not, and when it stops cleanly.

Every worker also anchors the audit chain's head outside the database (``audit.anchors``) every
``AUDIT_ANCHOR_INTERVAL_S`` seconds (0 turns it off), on a second timer thread.

Every worker also scores unfinished eval runs (``evals.services.eval_runs_refresh_open``) every
``PLATFORM_EVAL_REFRESH_S`` seconds (0 turns it off), timing out cases whose runs never finish.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import random
import socket
import threading
from collections.abc import Callable

from celery import Celery, bootsteps
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

import agent_platform.telemetry as telemetry
from agent_platform.settings_deploy import PLATFORM_RECONCILE_INTERVAL_S, PLATFORM_WORKER_DB_CONN_MAX_AGE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")
# Traces when the OTEL_* variables ask for them (web and worker both import this module), and the trace context
# carried from the publisher to the worker in each task message's headers.
telemetry.configure_tracing()
telemetry.connect_celery_signals()

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


# One database connection per worker process, kept across runs: Celery's Django fixup otherwise closes it before
# and after every task, so that each run opened a new one (on PostgreSQL, a connection costs more than the run's
# own queries). The fixup then closes it only every CELERY_DB_REUSE_MAX tasks; ``_keep_database_connection`` below
# closes it earlier when it broke or is older than PLATFORM_WORKER_DB_CONN_MAX_AGE (0: a connection per run).
if PLATFORM_WORKER_DB_CONN_MAX_AGE > 0:
    app.conf.update(CELERY_DB_REUSE_MAX=1_000_000)


@after_setup_logger.connect
@after_setup_task_logger.connect
@worker_process_init.connect
def _mask_every_log_handler(**_kwargs: object) -> None:
    """Celery gives its task logger (``celery.task``, which does not propagate) and its own loggers handlers of
    their own, after Django configured logging: each gets the secret-masking filter too, so no log line of a
    worker, Celery's included, carries a registered secret."""
    from audit.masking import install_logging_filter

    install_logging_filter()


_keeps_connection = False  # set in a worker's processes only (not where tasks run eagerly, e.g. tests)


@worker_init.connect
@worker_process_init.connect
def _worker_database_connection_lives(**_kwargs: object) -> None:
    global _keeps_connection
    if PLATFORM_WORKER_DB_CONN_MAX_AGE > 0:
        from django.db import connections

        for alias in connections:
            connections[alias].settings_dict["CONN_MAX_AGE"] = PLATFORM_WORKER_DB_CONN_MAX_AGE
        _keeps_connection = True


@worker_init.connect
def _import_the_run_path(**_kwargs: object) -> None:
    """Import what a run executes (the engine, LangGraph, the model providers, the gate, the MCP SDK: about three
    seconds of imports on a small machine) in the worker's main process, before it says it is ready: the pool
    processes it forks have it, and no run waits for it. Django's own start loads none of it, so ``manage.py``
    commands and web processes start without it (``mcpregistry.gate_records``, ``agents.rule_tester``)."""
    from agents import execution  # noqa: F401


@worker_process_init.connect
def _open_shared_mcp_sessions(**_kwargs: object) -> None:
    """In each of a worker's pool processes, open its shared MCP sessions in the background as it starts
    (``PLATFORM_MCP_OPEN_AT_START``, on by default): the first run does not wait for a stdio server to start
    (about two seconds for the demo server), and a process is ready to take runs meanwhile (a run that comes
    first opens the session itself, once)."""
    from django.conf import settings

    if not getattr(settings, "PLATFORM_MCP_OPEN_AT_START", True):
        return
    threading.Thread(target=_open_sessions_now, name="mcp-open-at-start", daemon=True).start()


def _open_sessions_now() -> None:
    from django.db import connection

    from mcpregistry.local_tools import LOCAL_TRANSPORT
    from mcpregistry.models import McpServer
    from mcpregistry.pool import get_default_pool

    try:
        servers = list(
            McpServer.objects.filter(enabled=True, session_scope=McpServer.SessionScope.SHARED, agents__enabled=True)
            .exclude(transport=LOCAL_TRANSPORT)
            .distinct()
        )
    except Exception:
        logger.warning("could not read the MCP servers to open at start", exc_info=True)
        return
    finally:
        connection.close()  # this thread's own connection: nothing else uses it
    from audit.masking import register_secrets

    for server in servers:
        # Before the session opens, as discovery and the gate do: what the server writes to its stderr (logged at
        # DEBUG) and the error it dies with (logged below) are masked in this process.
        try:
            register_secrets(server.secret_values())
            get_default_pool().open(server.connection_config(), timeout_s=max(float(server.timeout_s or 0), 30.0))
            logger.info("MCP server %s: session opened at start", server.mcp_id)
        except Exception:  # the first call opens it again, and reports what fails
            logger.warning("MCP server %s: could not open a session at start", server.mcp_id, exc_info=True)


@task_prerun.connect
def _keep_database_connection(task: object = None, **_kwargs: object) -> None:
    """Before each task in a worker: close this process's connection if it broke or outlived its age (Django's
    own check, as at the start of a web request); otherwise the task reuses it."""
    if _keeps_connection and not getattr(getattr(task, "request", None), "is_eager", False):
        from django.db import close_old_connections

        close_old_connections()


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
_chain_timer: WorkerTimer | None = None


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


@worker_ready.connect
def _start_audit_chainer(**_kwargs: object) -> None:
    """Chain audit events that writers left pending (a writer killed between its commit and the chaining) every
    ``AUDIT_CHAIN_INTERVAL_S`` (0: off). Each process's chainer thread chains its writers' events just after commit;
    this only bounds the lag."""
    from django.conf import settings

    from audit.services import audit_chain_pending, chain_mode

    global _chain_timer
    interval_s = float(settings.AUDIT_CHAIN_INTERVAL_S)
    if interval_s <= 0 or _chain_timer is not None or chain_mode() != "deferred":
        return

    def chain_pass() -> None:  # returns nothing: a number would be read as seconds until the next pass
        audit_chain_pending()

    _chain_timer = WorkerTimer("audit-chain", interval_s, chain_pass)
    _chain_timer.start()
    logger.info("audit chainer started in this worker (every %g s)", interval_s)


_heartbeat_timer: WorkerTimer | None = None
_eval_timer: WorkerTimer | None = None


def _worker_name() -> str:
    """This worker's name in its heartbeat row (its main process's, where the timers run)."""
    return f"{socket.gethostname()}:{os.getpid()}"


# Set while this worker's consumer is connected to the broker and consuming (``ConsumerConnected``).
_consuming = threading.Event()


class ConsumerConnected(bootsteps.StartStopStep):
    """A step of the worker's consumer, started once it connected to the broker and its task consumer started, and
    stopped whenever the consumer restarts (the broker connection was lost: it reconnects, retrying, before it
    starts its steps again) or stops. The heartbeat says a worker is alive only while this step runs: the timer
    thread keeps running while the consumer cannot reach the broker, and a worker that takes no task must not
    count as one for ``/readyz`` and ``platform_workers_alive``."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: object) -> None:
        _consuming.set()

    def stop(self, parent: object) -> None:
        _consuming.clear()

    shutdown = stop


app.steps["consumer"].add(ConsumerConnected)


def _worker_heartbeat() -> None:
    """This worker's heartbeat while its consumer is connected and consuming; none while it is not (the broker is
    away: the consumer retries), so that the probes stop counting it within one heartbeat, not only once the row
    ages out."""
    from agents.heartbeats import this_broker, worker_heartbeat_forget, worker_heartbeat_record

    if _consuming.is_set():
        # What it consumes (``-Q``, and queues added since by ``add_consumer``) and from which broker: /readyz wants a
        # worker that takes live runs from the web's own broker, not any worker.
        queues = list(app.amqp.queues.consume_from.copy())
        worker_heartbeat_record(worker=_worker_name(), queues=queues, broker=this_broker())
    else:
        worker_heartbeat_forget(worker=_worker_name())


@worker_ready.connect
def _start_worker_heartbeat(**_kwargs: object) -> None:
    """Say this worker is alive every ``PLATFORM_WORKER_HEARTBEAT_S`` (``/readyz`` asks for a recent one)."""
    from django.conf import settings

    global _heartbeat_timer
    interval_s = float(settings.PLATFORM_WORKER_HEARTBEAT_S)
    if interval_s <= 0 or _heartbeat_timer is not None:
        return
    _heartbeat_timer = WorkerTimer("worker-heartbeat", interval_s, _worker_heartbeat)
    _heartbeat_timer.start()


def _refresh_evals() -> None:  # returns nothing: a number would be read as seconds until the next pass
    from evals.services import eval_runs_refresh_open

    eval_runs_refresh_open()


@worker_ready.connect
def _start_eval_refresher(**_kwargs: object) -> None:
    """Score unfinished eval runs every ``PLATFORM_EVAL_REFRESH_S`` (0: off): an eval started from the admin or the
    API finishes without anyone loading its page, and its overdue cases time out (``PLATFORM_EVAL_CASE_TIMEOUT_S``)."""
    from django.conf import settings

    global _eval_timer
    interval_s = float(settings.PLATFORM_EVAL_REFRESH_S)
    if interval_s <= 0 or _eval_timer is not None:
        return
    _eval_timer = WorkerTimer("eval-refresh", interval_s, _refresh_evals)
    _eval_timer.start()


@worker_shutdown.connect
def _stop_timers(**_kwargs: object) -> None:
    for timer in (_reconciler, _anchor_timer, _chain_timer, _heartbeat_timer, _eval_timer):
        if timer is not None:
            timer.stop.set()
            timer.thread.join(timeout=10)
    if _heartbeat_timer is not None:
        _forget_worker_heartbeat()


@worker_shutdown.connect
def _exit_without_the_final_collection(**_kwargs: object) -> None:
    """Freeze the garbage collector's objects as the worker's main process exits (at ``atexit``, after its stop):
    Python's finalization otherwise walks the whole heap a few times over (the run path's imports: about 300,000
    objects), 1 to 2 seconds of an idle worker's 3 to 5 second warm shutdown, to free memory the process hands
    back anyway. Nothing of the worker's own is left to that walk: its pool, its sessions, its database connections,
    its logs and its audit chainer are closed or flushed explicitly (their ``atexit`` handlers still run); only the
    finalizers of objects caught in reference cycles do not run, as Python never promises at exit. At ``atexit``,
    not here: a worker run inside another process (Celery's test worker) leaves that process's heap alone."""
    atexit.register(gc.freeze)


def _forget_worker_heartbeat() -> None:
    """Remove this worker's heartbeat as it stops cleanly (after its timer, which would write it again): the probes
    no longer count a stopped worker alive. A worker killed outright cannot: its row ages out, as before."""
    from django.db import connection

    from agents.heartbeats import worker_heartbeat_forget

    try:
        worker_heartbeat_forget(worker=_worker_name())
    except Exception:  # the database is away: the row ages out
        logger.warning("could not remove this worker's heartbeat as it stops", exc_info=True)
    finally:
        connection.close()
