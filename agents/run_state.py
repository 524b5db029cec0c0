"""Changes of a run's state made outside its worker: queueing a parked run again, failing or re-queueing one whose
worker is gone (the reconciler), and the run's event log (``RunEventWriter``). Every status change is
compare-and-swap; a re-queued run's task is published when the transaction commits (``agents.dispatch``).

Light on purpose (no engine, no LangGraph): the approvals, the reconciler, the services and the worker's
``agents.execution`` all import it, and it imports none of them (``agents.shadow``, which it calls after failing a
run, is as light).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from agents.budgets import budget_settle
from agents.decision_reasons import UNUSED_APPROVAL
from agents.dispatch import RETRYABLE_ERRORS, lifecycle_setting, run_dispatch
from agents.models import Approval, Run, RunEvent
from agents.run_wakeup import run_changed
from agents.selectors import cancellation_recorded
from agents.shadow import shadow_after_store
from audit.masking import mask_value
from audit.row_statements import RowInsert
from audit.services import audit_event_record

logger = logging.getLogger(__name__)

# The reason code of a run that could not be set up, and of a submission refused, because a secret stored in the
# configuration cannot be decrypted with this process's ``SECRETS_ENCRYPTION_KEYS`` (a key missing on this machine,
# or dropped at a rotation: system check ``audit.W003``). Its messages name the setting, never the secret.
SECRET_UNREADABLE = "config:secret_unreadable"  # noqa: S105 - a reason code, not a secret
# A run's stored message for it (English, as every stored message; the run page reads it in the reader's language).
CONFIGURATION_UNREADABLE_MESSAGE = (
    "a stored secret of the run's configuration cannot be decrypted: check SECRETS_ENCRYPTION_KEYS"
)


# --- queueing again ----------------------------------------------------------------------------------------


def run_row_lock(run_id: Any) -> None:
    """Lock the run's row until the transaction ends (FOR NO KEY UPDATE: inserts that refer to the run are not
    blocked). Whatever decides, expires or resumes a run's approvals takes it first, as the pass that stores the
    run's park holds it: the two never miss each other."""
    Run.objects.select_for_update(no_key=True).filter(pk=run_id).values_list("pk", flat=True).first()


def run_resume(*, run_id: str) -> bool:
    """A parked run whose approval was decided (or expired) goes back to the queue, once, with its ``status``
    event (the moment it left the wait, which A2A stamps its task with); its task is sent when the transaction
    commits. Its deliveries are counted afresh. Returns whether it was parked (and is queued)."""
    now = timezone.now()
    stale = timedelta(seconds=float(lifecycle_setting("PLATFORM_RUN_QUEUED_STALE_S")))
    resumed = Run.objects.filter(id=run_id, status=Run.Status.AWAITING_APPROVAL).update(
        status=Run.Status.QUEUED, delivery_count=0, lease_expires_at=now + stale
    )
    if resumed == 1:
        RunEventWriter(run_id=run_id, secrets=[]).emit("status", {"status": "queued"})
        time_limit_s, purpose, traceparent = (
            Run.objects.filter(id=run_id).values_list("agent__time_limit_s", "purpose", "traceparent").get()
        )
        transaction.on_commit(
            lambda: run_dispatch(
                run_id=str(run_id), time_limit_s=time_limit_s, purpose=purpose, traceparent=traceparent
            )
        )
    return resumed == 1


# --- state changes made without a live worker (a claim that finds its worker gone, the reconciler) ------------


@dataclass(frozen=True)
class UnheldChange:
    """What a change of a run nobody holds did (``run_requeue_unheld``, ``run_fail_unheld_counted``): whether the
    run was still as read, and changed; and how many of its approved calls left claimed it ended
    ``outcome_unknown`` with it (``approvals_interrupted``), which the reconciler reports."""

    changed: bool
    approvals_interrupted: int = 0


def run_fail_unheld(*, run_id: Any, match: dict[str, Any], error_code: str, error_message: str) -> bool:
    """``run_fail_unheld_counted``: whether the run was failed."""
    return run_fail_unheld_counted(
        run_id=run_id, match=match, error_code=error_code, error_message=error_message
    ).changed


def run_fail_unheld_counted(*, run_id: Any, match: dict[str, Any], error_code: str, error_message: str) -> UnheldChange:
    """Fail a run nobody should be running any more (time limit passed, worker lost, a pass that crashed), if it
    still is as read: compare-and-swap on ``match`` (status, worker, delivery, …), with its ``status`` event, in one
    transaction; its approvals end and its budgets are settled in it.

    A failure that cannot be recorded whole (an approval of the run or its agent that cannot be read, such as a
    secret this process cannot decrypt) is logged and recorded bare, the run's status and its ``status`` event, its
    budgets settled: the run never stays ``running`` because of what it left behind; its approvals end at the
    reconciler's step 6. Only what a retry can fix (``RETRYABLE_ERRORS``: the database or the broker) is raised,
    for the caller to retry."""
    try:
        failed = _run_fail_recorded(run_id=run_id, match=match, error_code=error_code, error_message=error_message)
    except RETRYABLE_ERRORS:
        raise
    except Exception:
        logger.exception("run %s: its failure (%s) could not be recorded whole; recorded bare", run_id, error_code)
        failed = _run_fail_recorded(
            run_id=run_id, match=match, error_code=error_code, error_message=error_message, bare=True
        )
    if failed.changed:
        logger.warning("run %s failed: %s (%s)", run_id, error_code, error_message)
        # As after a stored outcome (``agents.execution._store_outcome``), once the failure is committed: a live run
        # may start its shadow, a shadow is compared with its live run (a candidate that timed out where the live
        # version answered is the disagreement that matters most). Never raises.
        shadow_after_store(run_id=run_id)
    return failed


def _run_fail_recorded(
    *, run_id: Any, match: dict[str, Any], error_code: str, error_message: str, bare: bool = False
) -> UnheldChange:
    """``run_fail_unheld``'s transaction. ``bare``: the status, its event and the budgets' settlement alone."""
    interrupted = 0
    with transaction.atomic():
        failed = Run.objects.filter(id=run_id, **match).update(
            status=Run.Status.FAILED,
            error_code=error_code,
            error_message=error_message,
            finished_at=timezone.now(),
            lease_expires_at=None,
        )
        if failed == 1:
            RunEventWriter(run_id=run_id, secrets=[]).emit(
                "status", {"status": "failed", "answer": "", "error": error_code}
            )
            if not bare:
                interrupted = approvals_interrupted(run_id=run_id, why=error_code)
                approvals_unused(run_id=run_id, why=error_code)
            # Bare too: the settlement reads no approval, and nothing settles a finished run's reservation later
            # (it held its budget's room for good). Once: each reservation is settled by compare-and-swap.
            budget_settle(run_id=run_id)
    return UnheldChange(changed=failed == 1, approvals_interrupted=interrupted)


def run_requeue_unheld(
    *,
    run_id: Any,
    match: dict[str, Any],
    time_limit_s: int,
    reason: str,
    purpose: str | None = None,
    traceparent: str = "",
) -> UnheldChange:
    """Put a running run whose worker is gone back in the queue, if it still is as read (compare-and-swap on
    ``match``), with its ``status`` event; its task is dispatched again when the transaction commits, to the
    queue of its ``purpose`` (``agents.dispatch.run_queue``), its span linked to the run's first trace
    (``traceparent``, ``Run.traceparent`` as read). The approved calls that worker left claimed end
    ``outcome_unknown`` in the same transaction (counted in what it returns)."""
    stale = timedelta(seconds=float(lifecycle_setting("PLATFORM_RUN_QUEUED_STALE_S")))
    interrupted = 0
    with transaction.atomic():
        requeued = Run.objects.filter(id=run_id, **match).update(
            status=Run.Status.QUEUED, lease_expires_at=timezone.now() + stale
        )
        if requeued == 1:
            RunEventWriter(run_id=run_id, secrets=[]).emit("status", {"status": "queued", "reason": reason})
            interrupted = approvals_interrupted(run_id=run_id, why="worker_lost")
            transaction.on_commit(
                lambda: run_dispatch(
                    run_id=str(run_id), time_limit_s=time_limit_s, purpose=purpose, traceparent=traceparent
                )
            )
    if requeued == 1:
        logger.warning("run %s queued again: %s", run_id, reason)
    return UnheldChange(changed=requeued == 1, approvals_interrupted=interrupted)


def approvals_interrupted(*, run_id: Any, why: str) -> int:
    """The run's approved calls that a worker claimed (``executing``) and never recorded end ``outcome_unknown``:
    the worker stopped (it died, or its time ran out) after it claimed the call, perhaps after the call went out.
    They are never executed again; each change is audited. Call it only once the run's previous worker is known
    to be gone (its lease lapsed, or the run was failed or taken over). Returns how many changed."""
    changed = 0
    for approval in Approval.objects.filter(run_id=run_id, status=Approval.Status.EXECUTING):
        result = {"ok": False, "reason": "approval:outcome_unknown", "value": None, "outcome_unknown": True}
        if Approval.objects.filter(pk=approval.pk, status=Approval.Status.EXECUTING).update(
            status=Approval.Status.OUTCOME_UNKNOWN, result=result
        ):
            changed += 1
            approval_ended_record(
                approval, source="agent", outcome="outcome_unknown", actor="reconciler", result={"why": why}
            )
            logger.warning("run %s: approval %s ended outcome_unknown (%s)", run_id, approval.pk, why)
    return changed


def approvals_unused(*, run_id: Any, why: str, keep: Iterable[Any] = (), reason: str = UNUSED_APPROVAL) -> int:
    """A run that ended (succeeded, failed, cancelled after its worker stopped) will never make the calls it still
    has approvals for: those waiting for a person, and those approved and never carried out (a code rule or a flow
    that took another branch when it was decided again, a model that answered instead). They end ``expired``
    (``reason``, translated where shown), each audited as ``approval.unused``, so that no approval reads
    "approved" for a call that was never made. Call it once no worker will run the run again, or, with ``keep``
    (the approvals a parking pass asked for), as a pass parks (``RunApprovals.end_unasked``). An approval that
    would have lapsed later is marked lapsed now (its ``expires_at``). Returns how many changed."""
    changed = 0
    waiting = (Approval.Status.PENDING, Approval.Status.APPROVED)
    left = Approval.objects.filter(run_id=run_id, status__in=waiting).exclude(pk__in=list(keep))
    for approval in left.order_by("created_at"):
        # It lapses now: its ``expires_at`` said a later time (a page read "expired" at a time still to come).
        now = timezone.now()
        lapsed = Case(When(expires_at__gt=now, then=Value(now)), default=F("expires_at"))
        if Approval.objects.filter(pk=approval.pk, status=approval.status).update(
            status=Approval.Status.EXPIRED, reason=reason, expires_at=lapsed
        ):
            changed += 1
            approval_ended_record(
                approval,
                source=_requester(approval.call_id),
                outcome="unused",
                actor="system",
                result={"was": approval.status, "why": why},
            )
    return changed


def approval_ended_record(approval: Approval, *, source: str, outcome: str, actor: str, result: dict[str, Any]) -> None:
    """The audit event of an approval ended without a person (``approval.<outcome>``, reason
    ``approval:<outcome>``), naming its call."""
    audit_event_record(
        source=source,
        action=f"approval.{outcome}",
        run_id=approval.run_id,
        mcp_id=approval.mcp_id,
        tool=approval.tool,
        call_id=approval.call_id,
        args=approval.args,
        result={"approval_id": str(approval.pk), **result},
        ok=False,
        reason=f"approval:{outcome}",
        attempt=0,
        actor=actor,
    )


def _requester(call_id: str) -> str:
    """The audit source of the call an approval was asked for: a rule's, a flow's, or the model's."""
    if call_id.startswith("rule:"):
        return "deterministic"
    return "flow" if call_id.startswith("flow:") else "agent"


# --- a cancelled run's failed calls ----------------------------------------------------------------------------


def counts_as_failed(result: Mapping[str, Any]) -> bool:
    """Whether a call counts into the run's ``tool_failures``, by its result (``gate.ToolResult.as_dict()``, as a
    rule's result and a call's event hold it): it failed, or the gate answered it from its fallback
    (``fallback_for``): it failed all the same. The rule of the counts an outcome stores (``agents.engine``'s, which
    a cancelled run's end cannot import: the web process that cancels loads no run path)."""
    return not result.get("ok") or bool(result.get("fallback_for"))


# The events that carry a tool call's result: a rule's (``deterministic_result``), a model's or a flow's
# (``tool_call``).
_CALL_EVENTS = ("deterministic_result", "tool_call")


def cancelled_pass_failures(*, run_id: Any) -> int:
    """The failed calls (``counts_as_failed``; a write that waits for a person has not failed, as a flow counts) of
    the pass a cancellation stopped, by their events: those after the pass's ``status: running`` event where it is
    the run's last ``status`` event (a pass that parked stored its count; one given back is made again). What
    earlier passes counted is in the run's ``tool_failures``."""
    statuses = RunEvent.objects.filter(run_id=run_id, kind="status").order_by("-seq").values_list("seq", "data")
    last = statuses.first()
    if last is None or not isinstance(last[1], dict) or last[1].get("status") != Run.Status.RUNNING:
        return 0
    calls = RunEvent.objects.filter(run_id=run_id, seq__gt=last[0], kind__in=_CALL_EVENTS)
    return _failed_calls(calls.values_list("kind", "data"))


def _failed_calls(events: Iterable[tuple[str, Any]]) -> int:
    """How many of ``events`` are calls that count as failed (``counts_as_failed``), a write that waits for a person
    excepted: the one rule of the count at a cancelled run's end and of the calls appended after it."""
    results = [data for kind, data in events if kind in _CALL_EVENTS and isinstance(data, dict)]
    return sum(1 for data in results if counts_as_failed(data) and data.get("error") != "approval:pending")


# --- the claim --------------------------------------------------------------------------------------------


# A run's events: one compiled statement (audit/row_statements.py) instead of the ORM's insert per event.
_EVENT_INSERT = RowInsert(RunEvent, ("run", "seq", "kind", "data", "created_at"))


def _ends_a_wait(kind: str, data: Any) -> bool:
    """Whether an event may end a ``?wait`` (a status other than ``running``: a run that starts, or starts a pass,
    is still to be waited for). The others wake only the run's event streams and live views."""
    return kind == "status" and not (isinstance(data, dict) and data.get("status") == "running")


# What a worker's writer appends after its claim lost the run (``RunEventWriter._appendable``): its claim's own
# ``status`` events, and the usage of a model call it had out (the run is charged for it).
_APPENDED_WHEN_LOST = frozenset({"status", "model_turn"})


def _only_numbers(value: Any) -> bool:
    if isinstance(value, dict):
        return all(_only_numbers(item) for item in value.values())
    return type(value) in (int, float)


class RunEventWriter:
    """Appends a run's progress to ``RunEvent`` (masked), numbered after what was written before.

    Numbers are unique per run: if another writer took the next number (a worker that lost the run and has not
    noticed yet, a cancellation), the event is numbered again after it. Each event wakes the run's waiters when
    it is committed (``agents.run_wakeup``)."""

    def __init__(
        self,
        *,
        run_id: Any,
        secrets: list[str],
        last_seq: int | None = None,
        appends_while: Callable[[], bool] | None = None,
    ) -> None:
        """``last_seq``: the run's last event number where the caller knows it (0 for a run no worker has
        started: one query fewer; a wrong guess costs a collision, numbered again as any other).
        ``appends_while``: a worker's writer appends its progress (every event but ``status`` and ``model_turn``)
        only while this says so, i.e. while its claim holds the run (``agents.execution.RunClaim.may_append``): a
        worker that lost the run and woke late (its process paused past its lease) appends none of its steps
        after the run's end or into another worker's pass; what its calls did is in the audit log, written by the
        gate. Its ``status`` events are its claim's own (each stored with a compare-and-swap, or the cancellation
        it ends with); its ``model_turn`` events carry what its model calls used, which the run is charged
        whenever they return (``agents.budgets.run_spent_usage``), so they are appended still, marked ``late``."""
        self.run_id = run_id
        self.secrets = secrets
        self.seq = self._last_seq() if last_seq is None else last_seq
        self.appends_while = appends_while

    def _last_seq(self) -> int:
        last = RunEvent.objects.filter(run_id=self.run_id).order_by("-seq").values_list("seq", flat=True).first()
        return last or 0

    def emit_cancelled(self) -> None:
        """The last ``status`` event of a run cancelled (written by whoever records its end: the cancel itself, the
        worker that stopped, or the reconciler once that worker is surely gone), with its budgets' settlement in
        the same transaction: a cancelled run's reservation, which a live worker's model call may still spend, is
        given back only as its end is recorded, and whoever sees that end sees its spend counted. Settled once
        (``budget_settle``: compare-and-swap; a later call adds only what was spent since).

        With the end, the run's ``tool_failures`` counts the failed calls of the pass it stopped
        (``cancelled_pass_failures``: a cancelled run stores no outcome, which is where the others are counted), and
        its lease is cleared: no worker holds a run whose end is recorded (the run page showed a lease minutes ahead).

        Written once: a worker paused past its lease, whose run a cancel found unheld and ended, stops later and
        ends it too; it settles what it spent since, and appends no second end (the run's row is locked first, so
        two recording it at once take turns). The failed calls it appended after the end were counted as they were
        appended (``emit_many``), so a second end, or a third (a worker's fault path ends it again), counts none."""
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=self.run_id).values_list("pk", flat=True).first()
            budget_settle(run_id=self.run_id)
            cancelled = Run.objects.filter(pk=self.run_id, status=Run.Status.CANCELLED)
            if cancellation_recorded(run_id=self.run_id):
                cancelled.update(lease_expires_at=None)
                return
            failures = cancelled_pass_failures(run_id=self.run_id)
            cancelled.update(tool_failures=F("tool_failures") + failures, lease_expires_at=None)
            self.emit("status", {"status": "cancelled", "answer": "", "error": "cancelled"})

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.emit_many([(kind, data)])

    def emit_many(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """``emit`` for several events in a row, as one insert: all of them, numbered in order, or (after a
        collision) numbered again after what the other writer wrote."""
        kept = self._appendable(events)
        if not kept:
            return
        masked = [(kind, self._masked(data)) for kind, data in kept]
        failed = _failed_calls(kept) if self.appends_while is not None else 0
        if not failed:
            self._write(masked)
            return
        self._write_counting_late(masked, failed=failed)

    def _write_counting_late(self, masked: list[tuple[str, Any]], *, failed: int) -> None:
        """Write a worker's events holding ``failed`` failed calls, counting them into the run's ``tool_failures``
        where they land after its end: the run was cancelled while this worker held it and its end was recorded
        without it (a cancel or the reconciler found it unheld: its process was paused past its lease), counting
        the failed calls appended before. Each call is counted once, by whichever comes second: the end counts the
        calls before it, the writer those after it. The run's row is locked first (the end locks it too), so the
        two never miss each other; only a failed call pays for it."""
        with transaction.atomic():
            run_row_lock(self.run_id)
            self._write(masked)
            if cancellation_recorded(run_id=self.run_id):
                Run.objects.filter(pk=self.run_id).update(tool_failures=F("tool_failures") + failed)

    def _masked(self, data: dict[str, Any]) -> Any:
        """``data`` masked with the run's secrets, except its ``usage`` where that holds only numbers: token counts
        are no secret, and one masked as text (a secret made of digits that equals it: ``PAGE_SIZE=1024`` and 1024
        input tokens) was counted as nothing by ``run_spent_usage``."""
        usage = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage, dict) or not _only_numbers(usage):
            return mask_value(data, secrets=self.secrets)
        masked = mask_value({key: value for key, value in data.items() if key != "usage"}, secrets=self.secrets)
        return {**masked, "usage": dict(usage)}

    def _appendable(self, events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """``events`` less the progress ones a worker that lost the run may no longer append (``appends_while``).
        A model call that returns after that is still charged: its ``model_turn`` event is kept as its usage alone,
        marked ``late`` (made by a worker that no longer held the run), and counted when the run is settled, or
        settled again if it was (``agents.execution._count_late_tokens``)."""
        if self.appends_while is None or all(kind == "status" for kind, _ in events) or self.appends_while():
            return events
        # Of a late model turn only what it cost: its text and the calls it asked for were never used (a run page
        # showed them as a turn after the answer, asking for a call never made).
        kept = [
            (kind, {"usage": data.get("usage"), "late": True} if kind == "model_turn" else data)
            for kind, data in events
            if kind in _APPENDED_WHEN_LOST
        ]
        if len(kept) < len(events):
            logger.info(
                "run %s: no longer held by this worker: %d event(s) not appended", self.run_id, len(events) - len(kept)
            )
        return kept

    def _write(self, masked: list[tuple[str, Any]]) -> None:
        for attempt in range(3):
            rows = [
                RunEvent(run_id=self.run_id, seq=self.seq + i, kind=kind, data=data)
                for i, (kind, data) in enumerate(masked, start=1)
            ]
            if self._insert(rows):
                self.seq += len(rows)
                run_changed(run_id=self.run_id, status_changed=any(_ends_a_wait(kind, data) for kind, data in masked))
                return
            if attempt == 2:
                raise IntegrityError(f"run {self.run_id}: its event numbers kept being taken by another writer")
            self.seq = self._last_seq()

    def _insert(self, rows: list[RunEvent]) -> bool:
        """Insert the rows as numbered; False, leaving none of them, when another writer holds one of the numbers.
        Without a savepoint (two round trips on PostgreSQL): a taken number skips its row (``ON CONFLICT DO
        NOTHING``) and the rows that went in are taken out again, in the same transaction, so no reader sees a
        batch in part."""
        if len(rows) > 1 and not connection.in_atomic_block:
            with transaction.atomic():
                return self._insert(rows)
        inserted = _EVENT_INSERT.insert_new(rows)
        if len(inserted) == len(rows):
            return True
        if inserted:
            RunEvent.objects.filter(pk__in=inserted).delete()
        return False
