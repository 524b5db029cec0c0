"""The reconciler: one pass puts right what dead processes left behind. Every worker runs it on a timer
(``agent_platform.celery``), ``celery beat`` may run it (``agents.reconcile_runs``), and
``manage.py reconcile_runs`` runs it once. Every change is compare-and-swap on the row as it was read, so any
number of reconcilers (and workers) may run at once.

In order:

1. **time limit**: a ``running`` run whose pass (``pass_started_at``, set by the claim; for a run claimed before
   that column existed, the last ``status: running`` event, else ``started_at``) began
   longer ago than its hard time limit — Celery's limits had their chance, or did not apply (a pool without
   them) — fails with ``time_limit``;
2. **lost workers**: a ``running`` run whose lease expired (its worker stopped heart-beating) is queued again
   and dispatched, or fails with ``worker_lost`` once its worker has been lost ``PLATFORM_RUN_MAX_DELIVERIES``
   times (``run_worker_losses``: a pass that gave the run back on an error a retry can fix lost no worker);
3. **lost messages**: a ``queued`` run that no worker claimed before its ``lease_expires_at`` (else
   ``created_at`` + ``PLATFORM_RUN_QUEUED_STALE_S``: the process died between commit and publish, or the broker
   lost the message) is dispatched again; its deadline moves on, so each is re-sent once per period;
4. **approvals**: pending approvals past their time expire (``approvals_expire_due``; their runs resume);
5. **parked runs with nothing to wait for**: an ``awaiting_approval`` run none of whose approvals is pending
   (decided or expired where no transaction resumed it: an older version's race, a database restored from a
   backup) is queued again, so the model learns each decision;
6. **approvals of finished runs**: once a finished run's worker is surely gone (its hard time limit has passed
   since it finished), an approval it left claimed (``executing``: the process died mid-call after the run was
   cancelled) ends ``outcome_unknown``, and those left pending or approved end unused;
7. **runs cancelled while they ran**: once the worker of a run cancelled while it ran is surely gone (its hard
   time limit has passed: the run's ``lease_expires_at``, which ``run_cancel`` set to it), the run's last
   ``status`` event (``cancelled``) is appended if that worker never wrote it (it died first), so that event
   streams, the admin's live view and ``?wait`` see the run's end, and its budgets are settled (the cancellation
   left its reservation to that worker, whose model call under way could still spend it);
8. **reservations of finished runs**: a budget reservation a finished run still holds open is settled
   (``budget_settle``: once, by compare-and-swap, whoever else settles it): a budget created or switched on while
   the run was running reserved for it (``agents.budgets``), and the pass, claimed without a reservation, did not
   settle. A model call that was under way when the run was cancelled adds what it spent when it comes back
   (``agents.execution``'s late count), so nothing waits for its worker.

Steps 2 and 3 handle at most ``PLATFORM_RECONCILE_BATCH`` runs per pass, oldest first, so a backlog does not
flood the broker; steps 5 to 8 read as many. A row a step could not repair (its repair raised, or it was left for
later: a run within its time limit) is passed over: the next passes of this process read it after the others
(``_PassedOver``), so that a batch of such rows at the head of the queue does not keep every newer one waiting for
good, and try it again where the batch has room.

Each run is put right on its own, and each step too (``_alone``): one the reconciler cannot repair (a row it cannot
read, such as a secret stored with a key this process lacks) is logged with its id and the pass goes on, rather
than every pass dying on it first while approvals never expire and lost runs stay ``running``. A run whose worker
is lost and that cannot be queued again is failed instead. What a retry can fix (``RETRYABLE_ERRORS``: the database
or the broker cannot be reached) ends the pass: the next one tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from agents.approvals import approvals_expire_due
from agents.budgets import budget_settle
from agents.dispatch import lifecycle_setting, repaired_alone, run_dispatch, run_time_limits
from agents.models import Approval, BudgetReservation, Run, RunEvent
from agents.run_state import (
    RunEventWriter,
    UnheldChange,
    approvals_interrupted,
    approvals_unused,
    run_fail_unheld_counted,
    run_requeue_unheld,
    run_resume,
    run_row_lock,
)
from agents.selectors import cancellation_recorded

logger = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    timed_out: int = 0
    requeued: int = 0
    worker_lost: int = 0
    # The approved calls the runs of steps 1 and 2 (failed, or queued again) had claimed, ended ``outcome_unknown``.
    approvals_interrupted: int = 0
    redispatched: int = 0
    approvals_expired: int = 0
    parked_resumed: int = 0
    approvals_ended: int = 0
    # Step 7: the ``cancelled`` ends recorded for runs whose worker died after the cancel.
    cancellations_recorded: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def changed(self) -> bool:
        return any(self.as_dict().values())


_Rows = TypeVar("_Rows", bound=QuerySet[Any, Any])


class _PassedOver:
    """The rows of one step that this process's passes read and could not repair: a repair that raised (a row it
    cannot read, such as an approval stored with a key this process lacks) or a row left for later (a run whose
    worker may still be finishing). Each pass reads them after the others, oldest first among each: taken oldest
    first, a batch of them at the head was every pass's batch, and each newer row waited for good (or until the
    ones left for later came due). They are read again where a batch has room, so each is retried; one repaired
    leaves the set.

    In the process's memory, as the reconciler holds no state of its own: a process that starts afresh reads them
    first once more, and passes over them from its second pass. Each pass first drops those no longer due
    (repaired since, here or by another process), so the set holds no more than the step's rows left unrepaired."""

    def __init__(self, field: str) -> None:
        self.field = field  # the row's id, as the step's query names it
        self.ids: set[Any] = set()

    def read(self, due: QuerySet[Any], *keys: str, shape: Callable[[QuerySet[Any]], _Rows], batch: int) -> list[Any]:
        """Up to ``batch`` of the step's ``due`` rows, ordered by ``keys`` and read as ``shape`` makes them (values,
        distinct): those passed over after the others. Two reads rather than one ordered by whether a row was passed
        over: PostgreSQL orders a ``SELECT DISTINCT`` only by what it selects."""
        if self.ids:
            self.ids = set(due.filter(**{f"{self.field}__in": list(self.ids)}).values_list(self.field, flat=True))
        if not self.ids:
            return list(shape(due.order_by(*keys))[:batch])
        passed_over = {f"{self.field}__in": list(self.ids)}
        rows = list(shape(due.exclude(**passed_over).order_by(*keys))[:batch])
        if len(rows) < batch:
            rows += shape(due.filter(**passed_over).order_by(*keys))[: batch - len(rows)]
        return rows

    def note(self, row_id: Any, *, repaired: bool) -> None:
        """What the pass did with a row it read: ``repaired`` unless its repair raised or it was left for later (a
        row another reconciler changed first counts as repaired: it is no longer due)."""
        if repaired:
            self.ids.discard(row_id)
        else:
            self.ids.add(row_id)


# Per step (2, 5, 6, 7, 8): what its batches pass over.
_LOST_PASSED_OVER = _PassedOver("id")
_PARKED_PASSED_OVER = _PassedOver("id")
_FINISHED_APPROVALS_PASSED_OVER = _PassedOver("run")
_CANCELLED_PASSED_OVER = _PassedOver("id")
_RESERVATIONS_PASSED_OVER = _PassedOver("run")


def runs_reconcile(*, now: datetime | None = None) -> ReconcileReport:
    """One pass (see the module's docstring). Returns what it changed."""
    now = now or timezone.now()
    report = ReconcileReport()
    report.timed_out, overdue_interrupted = repaired_alone(
        "fail the runs past their time limit", lambda: _fail_overdue_runs(now), (0, 0)
    )
    report.requeued, report.worker_lost, lost_interrupted = repaired_alone(
        "recover the runs of lost workers", lambda: _recover_runs_of_lost_workers(now), (0, 0, 0)
    )
    report.approvals_interrupted = overdue_interrupted + lost_interrupted
    report.redispatched = repaired_alone(
        "dispatch stale queued runs again", lambda: _redispatch_stale_queued_runs(now), 0
    )
    report.approvals_expired = repaired_alone("expire due approvals", approvals_expire_due, 0)
    report.parked_resumed = repaired_alone("resume parked runs", _resume_parked_runs_without_pending_approvals, 0)
    report.approvals_ended = repaired_alone(
        "end the approvals of finished runs", lambda: _end_approvals_of_finished_runs(now), 0
    )
    report.cancellations_recorded = repaired_alone(
        "end the runs cancelled while running", lambda: _end_runs_cancelled_while_running(now), 0
    )
    repaired_alone("settle the reservations of finished runs", _settle_finished_runs, None)
    if report.changed:
        logger.info("reconciled runs: %s", report.as_dict())
    return report


def runs_next_lease_due_in_s(*, now: datetime | None = None) -> float | None:
    """Seconds until the earliest lease of a running run lapses (negative if one has lapsed), or None when
    nothing runs. The worker's reconciler wakes then rather than a whole interval later."""
    now = now or timezone.now()
    due = (
        Run.objects.filter(status=Run.Status.RUNNING, lease_expires_at__isnull=False)
        .order_by("lease_expires_at")
        .values_list("lease_expires_at", flat=True)
        .first()
    )
    return None if due is None else (due - now).total_seconds()


def _fail_overdue_runs(now: datetime) -> tuple[int, int]:
    """Step 1: the runs failed, and the approved calls they had claimed that ended ``outcome_unknown``."""
    pass_started = Subquery(
        RunEvent.objects.filter(run=OuterRef("pk"), kind="status", data__status="running")
        .order_by("-seq")
        .values("created_at")[:1]
    )
    running = (
        Run.objects.filter(status=Run.Status.RUNNING)
        .annotate(pass_started=pass_started)
        .values(
            "id", "worker", "delivery_count", "started_at", "pass_started_at", "pass_started", "agent__time_limit_s"
        )
    )
    failed = interrupted = 0
    for row in running:
        began = row["pass_started_at"] or row["pass_started"] or row["started_at"]
        _soft, hard = run_time_limits(row["agent__time_limit_s"])
        if began is None or began + timedelta(seconds=hard) > now:
            continue
        change = repaired_alone("fail it (time limit)", partial(_fail_overdue_run, row), _UNCHANGED, run_id=row["id"])
        failed += change.changed
        interrupted += change.approvals_interrupted
    return failed, interrupted


# What a repair that raised changed (``repaired_alone``'s ``nothing``; told apart by identity).
_UNCHANGED = UnheldChange(changed=False)


def _fail_overdue_run(row: Mapping[str, Any]) -> UnheldChange:
    return run_fail_unheld_counted(
        run_id=row["id"],
        # The pass as read: a pass claimed since (a resumed run counts its deliveries afresh) is not this one.
        match={
            "status": Run.Status.RUNNING,
            "worker": row["worker"],
            "delivery_count": row["delivery_count"],
            "pass_started_at": row["pass_started_at"],
        },
        error_code="time_limit",
        error_message=f"the run did not finish within its time limit ({row['agent__time_limit_s']} s)",
    )


def _recover_runs_of_lost_workers(now: datetime) -> tuple[int, int, int]:
    """Step 2: the runs queued again, those failed, and the approved calls they had claimed that ended
    ``outcome_unknown``."""
    batch = int(lifecycle_setting("PLATFORM_RECONCILE_BATCH"))
    max_deliveries = int(lifecycle_setting("PLATFORM_RUN_MAX_DELIVERIES"))
    due = Run.objects.filter(status=Run.Status.RUNNING, lease_expires_at__lte=now)
    expired = _LOST_PASSED_OVER.read(
        due,
        "lease_expires_at",
        shape=lambda rows: rows.values(
            "id", "worker", "delivery_count", "lease_expires_at", "agent__time_limit_s", "purpose", "traceparent"
        ),
        batch=batch,
    )
    requeued = lost = interrupted = 0
    for row in expired:
        losses = run_worker_losses(run_id=row["id"], delivery_count=row["delivery_count"])
        queued = None
        if losses < max_deliveries:
            queued = repaired_alone("queue it again", partial(_requeue_lost_run, row), None, run_id=row["id"])
        if queued is None:  # its last delivery was lost, or it could not be queued again: never left running
            failed = repaired_alone(
                "fail it (worker lost)", partial(_fail_lost_run, row, losses), _UNCHANGED, run_id=row["id"]
            )
            lost += failed.changed
            interrupted += failed.approvals_interrupted
            _LOST_PASSED_OVER.note(row["id"], repaired=failed is not _UNCHANGED)
        else:
            requeued += queued.changed
            interrupted += queued.approvals_interrupted
            _LOST_PASSED_OVER.note(row["id"], repaired=True)
    return requeued, lost, interrupted


def run_worker_losses(*, run_id: Any, delivery_count: int) -> int:
    """How many times the run's worker was lost since it was submitted or last resumed, its lapsed pass included:
    its deliveries (``delivery_count``, the claims since then) less the passes that gave it back to the queue on an
    error a retry can fix (``run_retried_passes``), which the next delivery claims too. Without that, two database
    hiccups and one lost worker read as three lost workers, and the run failed where it should be taken over."""
    return max(delivery_count - run_retried_passes(run_id=run_id), 0)


def run_retried_passes(*, run_id: Any) -> int:
    """The passes since the run was submitted or last resumed (a resumed run's deliveries are counted afresh:
    ``run_resume``, after the park's ``awaiting_approval`` event) that gave it back to the queue on an error a
    retry can fix: its ``status`` events ``{"status": "queued", "reason": "retryable"}`` (``RunClaim.release``
    writes one with the release, in its transaction)."""
    statuses = RunEvent.objects.filter(run_id=run_id, kind="status")
    parked_at = statuses.filter(data__status="awaiting_approval").order_by("-seq").values_list("seq", flat=True).first()
    retried = statuses.filter(data__status="queued", data__reason="retryable")
    if parked_at is not None:
        retried = retried.filter(seq__gt=parked_at)
    return retried.count()


def _lost_run_as_read(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "status": Run.Status.RUNNING,
        "worker": row["worker"],
        "delivery_count": row["delivery_count"],
        "lease_expires_at": row["lease_expires_at"],
    }


def _requeue_lost_run(row: Mapping[str, Any]) -> UnheldChange:
    return run_requeue_unheld(
        run_id=row["id"],
        match=_lost_run_as_read(row),
        time_limit_s=row["agent__time_limit_s"],
        purpose=row["purpose"],
        traceparent=row["traceparent"],
        reason=f"worker_lost: {row['worker']} stopped renewing its lease",
    )


def _fail_lost_run(row: Mapping[str, Any], losses: int) -> UnheldChange:
    return run_fail_unheld_counted(
        run_id=row["id"],
        match=_lost_run_as_read(row),
        error_code="worker_lost",
        error_message=f"the worker running it was lost {losses} times",
    )


def _redispatch_stale_queued_runs(now: datetime) -> int:
    batch = int(lifecycle_setting("PLATFORM_RECONCILE_BATCH"))
    stale = timedelta(seconds=float(lifecycle_setting("PLATFORM_RUN_QUEUED_STALE_S")))
    due = (
        Run.objects.filter(status=Run.Status.QUEUED)
        .filter(Q(lease_expires_at__lte=now) | Q(lease_expires_at__isnull=True, created_at__lte=now - stale))
        .order_by("created_at")
        .values("id", "lease_expires_at", "agent__time_limit_s", "purpose", "traceparent")[:batch]
    )
    redispatched = 0
    for row in due:
        # Moving the deadline on is the compare-and-swap: of several reconcilers, one re-sends the message.
        moved = Run.objects.filter(
            id=row["id"], status=Run.Status.QUEUED, lease_expires_at=row["lease_expires_at"]
        ).update(lease_expires_at=now + stale)
        if moved == 1:
            logger.warning(
                "run %s was still queued after %s s; dispatching it again", row["id"], int(stale.total_seconds())
            )
            run_dispatch(
                run_id=str(row["id"]),
                time_limit_s=row["agent__time_limit_s"],
                purpose=row["purpose"],
                traceparent=row["traceparent"],
            )
            redispatched += 1
    return redispatched


def _resume_parked_runs_without_pending_approvals() -> int:
    batch = int(lifecycle_setting("PLATFORM_RECONCILE_BATCH"))
    pending = Approval.objects.filter(run=OuterRef("pk"), status=Approval.Status.PENDING)
    due = Run.objects.filter(status=Run.Status.AWAITING_APPROVAL).exclude(Exists(pending))
    parked = _PARKED_PASSED_OVER.read(
        due, "created_at", shape=lambda rows: rows.values_list("id", flat=True), batch=batch
    )
    resumed = 0
    for run_id in parked:
        done = repaired_alone("resume it", partial(_resume_parked_run, run_id), None, run_id=run_id)
        _PARKED_PASSED_OVER.note(run_id, repaired=done is not None)
        resumed += bool(done)
    return resumed


@transaction.atomic
def _resume_parked_run(run_id: Any) -> bool:
    # As a decision does: the run's row first, then what its approvals say now.
    run_row_lock(run_id)
    if Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING).exists():
        return False
    if not run_resume(run_id=str(run_id)):
        return False
    logger.warning("run %s was parked with no approval pending; queued again", run_id)
    return True


def _end_approvals_of_finished_runs(now: datetime) -> int:
    batch = int(lifecycle_setting("PLATFORM_RECONCILE_BATCH"))
    due = Approval.objects.filter(
        status__in=[Approval.Status.EXECUTING, Approval.Status.APPROVED, Approval.Status.PENDING],
        run__status__in=[Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED],
    )
    left = _FINISHED_APPROVALS_PASSED_OVER.read(
        due,
        "run__finished_at",  # oldest first; one row per run (no approval's own ordering in the DISTINCT)
        shape=lambda rows: rows.values_list("run_id", "run__finished_at", "run__agent__time_limit_s").distinct(),
        batch=batch,
    )
    ended = 0
    for run_id, finished_at, time_limit_s in left:
        _soft, hard = run_time_limits(time_limit_s)
        if finished_at is not None and finished_at + timedelta(seconds=hard) > now:
            # Its worker may still be finishing a call (a run cancelled while it ran): later, and after the others
            # (a run of a long time limit held those of short ones back until it came due).
            _FINISHED_APPROVALS_PASSED_OVER.note(run_id, repaired=False)
            continue
        count = repaired_alone("end its approvals", partial(_end_approvals_of, run_id), None, run_id=run_id)
        _FINISHED_APPROVALS_PASSED_OVER.note(run_id, repaired=count is not None)
        ended += count or 0
    return ended


def _settle_finished_runs() -> None:
    """Step 8: settle the open budget reservations of finished runs (held, they kept a budget's room from new runs
    with "runs in flight hold it", no run being in flight)."""
    batch = int(lifecycle_setting("PLATFORM_RECONCILE_BATCH"))
    due = BudgetReservation.objects.filter(
        settled_at__isnull=True, run__status__in=[Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED]
    ).exclude(  # a run cancelled while it ran keeps its reservation for its worker's call under way (step 7 settles it)
        run__status=Run.Status.CANCELLED, run__lease_expires_at__isnull=False
    )
    left = _RESERVATIONS_PASSED_OVER.read(
        due, "run_id", shape=lambda rows: rows.values_list("run_id", flat=True).distinct(), batch=batch
    )
    for run_id in left:
        settled = repaired_alone("settle its budgets", partial(_settle_alone, run_id), None, run_id=run_id)
        _RESERVATIONS_PASSED_OVER.note(run_id, repaired=settled is not None)


@transaction.atomic
def _settle_alone(run_id: Any) -> int:
    return budget_settle(run_id=run_id)


@transaction.atomic
def _end_approvals_of(run_id: Any) -> int:
    return approvals_interrupted(run_id=run_id, why="run_finished") + approvals_unused(
        run_id=run_id, why="run_finished"
    )


def _end_runs_cancelled_while_running(now: datetime) -> int:
    """Step 7: the ``cancelled`` event of each run cancelled while it ran whose worker's time is up (its
    ``lease_expires_at`` passed) and who never wrote it, with its budgets' settlement
    (``RunEventWriter.emit_cancelled``); the lease is cleared (compare-and-swap), so each run is handled once.
    Returns how many ends it recorded."""
    batch = int(lifecycle_setting("PLATFORM_RECONCILE_BATCH"))
    cancelled = Run.objects.filter(status=Run.Status.CANCELLED, lease_expires_at__lte=now)
    due = _CANCELLED_PASSED_OVER.read(
        cancelled, "lease_expires_at", shape=lambda rows: rows.values_list("id", "lease_expires_at"), batch=batch
    )
    recorded = 0
    for run_id, lease_expires_at in due:
        done = repaired_alone(
            "record its end (cancelled)", partial(_end_cancelled_run, run_id, lease_expires_at), None, run_id=run_id
        )
        _CANCELLED_PASSED_OVER.note(run_id, repaired=done is not None)
        if done:
            recorded += 1
            logger.warning("run %s: its worker never recorded the cancellation; its end is recorded now", run_id)
    return recorded


@transaction.atomic
def _end_cancelled_run(run_id: Any, lease_expires_at: datetime | None) -> bool:
    """Step 7 for one run: whether this pass recorded its end."""
    if not Run.objects.filter(id=run_id, status=Run.Status.CANCELLED, lease_expires_at=lease_expires_at).update(
        lease_expires_at=None
    ):
        return False  # another reconciler got there first
    if cancellation_recorded(run_id=run_id):
        return False  # its worker recorded its end
    RunEventWriter(run_id=run_id, secrets=[]).emit_cancelled()
    return True
