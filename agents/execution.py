"""Executing runs: claim a run with a lease, keep the lease alive while the engine runs, store the outcome only
while the claim is still ours; resume a parked one. (Publishing a run's task: ``agents.dispatch``;
changes made without a live worker: ``agents.run_state``.)

Every change of a run's status is compare-and-swap. A run's life::

    queued ──claim──► running ──store──► succeeded | failed | awaiting_approval (──resume──► queued)
      ▲                 │ worker, delivery_count + 1, lease_expires_at = now + lease (a heartbeat extends it)
      ├── reconciler ───┤ lease expired: queued again (lost fewer than PLATFORM_RUN_MAX_DELIVERIES times) or
      │                 │ failed (``worker_lost``); past the agent's time limit: failed (``time_limit``)
      └── release ──────┘ an error a retry can fix: given back for the task's retry, or failed
                          (``retries_exhausted``) at the ``RETRIED_PASSES_MAX``-th such pass

- A delivery of a run that is ``running`` under a live lease does nothing: another worker has it.
- A delivery of a run whose lease expired (its worker died) re-claims it, ``running → running`` by
  compare-and-swap on the old worker, delivery and lease, and runs it again. That is safe: read calls may
  repeat, and a write call needs an approval that is claimed before the call and records its outcome, so it
  is never made twice (``mcpregistry.gate._approval``); an approval the dead worker had claimed and not
  recorded ends ``outcome_unknown`` (``agents.run_state.approvals_interrupted``), never ``executing`` for ever.
- The heartbeat and the final store match this worker's claim (worker, delivery): a worker that lost its run
  (its lease lapsed and another worker took over, the reconciler failed it, someone cancelled it) changes
  nothing, and stops at its next step.

``lease_expires_at`` is the deadline of whoever holds the run: for a running run, its worker's; for a queued
run, its message's — if no worker has claimed the run by then, the reconciler presumes the message lost and
dispatches another (NULL: ``created_at`` + ``PLATFORM_RUN_QUEUED_STALE_S``); for a run cancelled while a live
worker held it, when that worker is surely gone (its hard time limit: the reconciler then records the run's end if
the worker did not). ``delivery_count`` counts the
claims since the run was submitted or last resumed after an approval; the times its worker was lost are those
claims less the passes given back on an error a retry can fix (``agents.reconciler.run_worker_losses``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import httpx
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Substr
from django.utils import timezone, translation
from django.utils.translation import gettext
from rest_framework.fields import DateTimeField

import agent_platform.telemetry as telemetry
from agent_platform.text import grapheme_cut, nfc
from agents import engine
from agents.approvals import RunApprovals
from agents.budgets import budget_settle, run_spent_usage, run_usage_fields, token_ceiling_sql
from agents.config_cache import run_parts
from agents.conversations import in_context
from agents.dispatch import RETRYABLE_ERRORS, lifecycle_setting, run_time_limits
from agents.errors import RunCancelled
from agents.models import Agent, Approval, Run
from agents.reconciler import run_retried_passes, run_worker_losses
from agents.run_state import (
    CONFIGURATION_UNREADABLE_MESSAGE,
    SECRET_UNREADABLE,
    RunEventWriter,
    approvals_interrupted,
    approvals_unused,
    run_fail_unheld,
    run_resume,
    run_row_lock,
)
from agents.selectors import RUN_READ
from agents.shadow import shadow_after_store
from agents.versions import AGENT_FIELDS
from audit.change_guard import config_generation_sql
from audit.masking import mask_text, register_secrets
from audit.row_statements import RowUpdate
from audit.services import audit_chain_held_off
from mcpregistry import gate
from mcpregistry.binding_policy import url_problem
from mcpregistry.crypto import SecretDecryptionError
from mcpregistry.pool import get_default_pool

logger = logging.getLogger(__name__)

# The time source for run deadlines (tests replace it).
clock: Callable[[], float] = time.monotonic

StopReason = Literal["", "time_limit", "lost"]


def worker_identity() -> str:
    """``hostname:pid`` of this process (a Celery pool process when a worker runs the run)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RunStopped(RunCancelled):
    """The run must stop at this step: its time limit passed, or this worker no longer holds it. (A subclass
    of ``RunCancelled`` so that the engine stops the same way; ``RunClaim.stop_reason`` says why.)"""


@dataclass
class RunClaim:
    """This worker's hold on one running run: ``(worker, delivery)`` identifies the claim in every
    compare-and-swap; the heartbeat thread extends its lease; ``check`` runs between the engine's steps."""

    run_id: Any
    worker: str
    delivery: int
    lease_s: float
    deadline: float  # on ``clock``: when the run's soft time limit is up
    # The run as claimed (its row read by the claim, with the claim's changes) and what was read with it.
    view: _ClaimView
    # On ``clock``: when the claim was last known to hold the run (its claim, a heartbeat, a check between steps).
    confirmed_at: float = 0.0
    stop_reason: StopReason = ""
    lost: threading.Event = field(default_factory=threading.Event)
    ended_elsewhere: bool = False  # found by ``may_append``: the run is another's, or ended without this worker

    def mine(self) -> QuerySet[Run]:
        return Run.objects.filter(
            id=self.run_id, status=Run.Status.RUNNING, worker=self.worker, delivery_count=self.delivery
        )

    def heartbeat(self) -> bool:
        """Extend the lease, if the claim is still ours. Returns False (and marks the claim lost) if not."""
        at, now = clock(), timezone.now()
        held = self.mine().update(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=self.lease_s)) == 1
        if held:
            self.confirmed_at = at
        else:
            self.lost.set()
        return held

    def start_heartbeat(self) -> None:
        """Have the process's heartbeat thread extend this claim's lease every third of it (``_Heartbeats``)."""
        _heartbeats.add(self)

    def stop_heartbeat(self) -> None:
        """No more beats for this claim (one in progress may still end; it changes nothing of a finished run)."""
        _heartbeats.remove(self)

    def heartbeat_interval(self) -> float:
        return max(self.lease_s / 3, 0.2)

    def time_is_up(self) -> bool:
        return clock() >= self.deadline

    def check(self) -> None:
        """Between steps: raise ``RunCancelled`` if the run was cancelled, ``RunStopped`` if its time limit has
        passed or the claim is no longer ours (``stop_reason`` says which)."""
        at = clock()
        row = _run_holder(self.run_id)
        if row is not None and row[0] == Run.Status.CANCELLED:
            raise RunCancelled()
        if self.lost.is_set() or row != (Run.Status.RUNNING, self.worker, self.delivery):
            self.stop_reason = "lost"
            raise RunStopped("this worker no longer holds the run")
        self.confirmed_at = at
        if self.time_is_up():
            self.stop_reason = "time_limit"
            raise RunStopped("time limit")

    def cancelled(self) -> bool:
        """Whether the run was cancelled (one query): what the gate asks of a call that failed before it sends it
        again or hands it to a fallback (``gate.run_cancellation``), where no step of the run's checks it."""
        row = _run_holder(self.run_id)
        return row is not None and row[0] == Run.Status.CANCELLED

    def may_append(self) -> bool:
        """Whether this worker may still append the run's progress events (``RunEventWriter.appends_while``): while
        its claim holds the run, or once the run was cancelled while it held it (it records the cancellation last).
        Without a query while the hold was confirmed less than half a lease ago: another worker takes a run over only
        once its lease has lapsed, so a run's events cost nothing more; a process that was paused longer (stopped,
        swapped out) reads the run's holder first, and once it finds the run another's or ended, appends none of its
        progress but its model calls' usage (``RunEventWriter._appendable``: a call that returns late is charged)."""
        if self.ended_elsewhere:
            return False
        at = clock()
        if not self.lost.is_set() and at - self.confirmed_at < self.lease_s / 2:
            return True
        row = _run_holder(self.run_id)
        if row is not None and row[1:] == (self.worker, self.delivery):
            if row[0] == Run.Status.RUNNING and not self.lost.is_set():
                self.confirmed_at = at
                return True
            if row[0] == Run.Status.CANCELLED:
                return True
        self.ended_elsewhere = True
        return False

    def release(self) -> None:
        """Give the run back to the queue (a retryable error: the task's retry claims it again), with its
        ``status`` event ``{"status": "queued", "reason": "retryable"}`` in the same transaction: the retry is a
        later delivery, and the run's page reads the reason to tell it from a pass that took the run over from a
        lost worker (``worker_lost: …``, or no ``queued`` event between the passes: a lapsed claim), as the count of
        lost workers does (``agents.reconciler.run_worker_losses``: a retry is no lost worker) and the bound on
        retried passes (``RETRIED_PASSES_MAX``). Best effort: if the database is down, the lease lapses instead
        (and the pass counts as a lost worker's)."""
        stale = timedelta(seconds=float(lifecycle_setting("PLATFORM_RUN_QUEUED_STALE_S")))
        try:
            with transaction.atomic():
                released = self.mine().update(status=Run.Status.QUEUED, lease_expires_at=timezone.now() + stale)
                if released == 1:
                    RunEventWriter(run_id=self.run_id, secrets=[]).emit(
                        "status", {"status": "queued", "reason": "retryable"}
                    )
        except DatabaseError as exc:
            logger.warning("run %s: could not release the claim (%s); its lease will lapse", self.run_id, exc)

    def fail(self, error_code: str, error_message: str) -> bool:
        return run_fail_unheld(
            run_id=self.run_id,
            match={"status": Run.Status.RUNNING, "worker": self.worker, "delivery_count": self.delivery},
            error_code=error_code,
            error_message=error_message,
        )


class _Heartbeats:
    """The process's one heartbeat thread, which extends the lease of every run the process holds, each every
    third of its lease, on a database connection of its own (opened for each round of beats and closed after it).
    A run adds its claim when it starts and removes it when it ends: no thread is started and joined per
    run (a third of a millisecond of a run's time, on this machine), and a run shorter than its first beat costs
    the thread nothing (it wakes when the earliest beat is due, or every last interval when idle; an added claim
    wakes it only if it is due before that). A claim found lost is dropped and logged; a database error is
    logged and the claim is beaten again at its next turn (its lease may lapse meanwhile: another worker then
    takes the run over and this one stops at its next step). A forked child starts afresh (``_forked``)."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.due: dict[int, tuple[float, RunClaim]] = {}  # id(claim) → (when it beats next, the claim)
        self.thread: threading.Thread | None = None
        self.wakes_at = 0.0  # when the waiting thread wakes (0: it is not waiting, it looks at ``due`` first)
        self.idle_s = 1.0

    def _forked(self) -> None:
        self.__init__()  # type: ignore[misc]  # the parent's lock, claims and thread are not the child's

    def add(self, claim: RunClaim) -> None:
        with self.changed:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="run-heartbeats", daemon=True)
                self.thread.start()
            at = time.monotonic() + claim.heartbeat_interval()
            self.due[id(claim)] = (at, claim)
            self.idle_s = claim.heartbeat_interval()
            if at < self.wakes_at:
                self.changed.notify()

    def remove(self, claim: RunClaim) -> None:
        with self.changed:
            self.due.pop(id(claim), None)

    def holds(self, claim: RunClaim) -> bool:
        with self.changed:
            return id(claim) in self.due

    def _loop(self) -> None:
        while True:
            with self.changed:
                now = time.monotonic()
                beating = [claim for at, claim in self.due.values() if at <= now]
                for claim in beating:
                    self.due[id(claim)] = (now + claim.heartbeat_interval(), claim)
                if not beating:
                    self.wakes_at = min((at for at, _ in self.due.values()), default=now + self.idle_s)
                    self.changed.wait(self.wakes_at - now)
                    self.wakes_at = 0.0
                    continue
            for claim in beating:
                self._beat(claim)
            try:
                connection.close()  # opened for these beats (a beat is seconds from the next: none is kept idle)
            except Exception:  # the thread beats on for every run of the process
                logger.warning("heartbeats: closing the database connection failed", exc_info=True)

    def _beat(self, claim: RunClaim) -> None:
        try:
            if not claim.heartbeat() and self.holds(claim):  # (a claim removed meanwhile: its run has ended)
                self.remove(claim)
                logger.warning("run %s: %s lost its claim (delivery %d)", claim.run_id, claim.worker, claim.delivery)
        except DatabaseError as exc:
            logger.warning("run %s: heartbeat failed: %s", claim.run_id, exc)
        except Exception:  # one claim's failure must not stop the beats of the others
            logger.exception("run %s: heartbeat failed", claim.run_id)


_heartbeats = _Heartbeats()
os.register_at_fork(after_in_child=_heartbeats._forked)


def _run_holder(run_id: Any) -> tuple[str, str, int] | None:
    """The run's (status, worker, delivery_count), or None: read between every two steps of a run, so in SQL
    made once rather than a query compiled each time."""
    table = connection.ops.quote_name(Run._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT status, worker, delivery_count FROM {table} WHERE id = %s",  # noqa: S608 - the model's table
            [Run._meta.get_field("id").get_db_prep_value(run_id, connection)],
        )
        row = cursor.fetchone()
    return None if row is None else (str(row[0]), str(row[1]), int(row[2]))


@dataclass(frozen=True)
class _ClaimView:
    """What one statement reads for a claim: the run's row (the claimed run goes on with this instance), its
    agent's time limit, and what its pass reads before anything else — the configuration's generation (for
    this process's cached configuration, ``agents.config_cache``) and the run's token ceiling (its smallest
    open budget reservation, taken at admission: ``agents.budgets.token_ceiling_sql``)."""

    run: Run
    time_limit_s: int
    generation: str | None
    token_ceiling: int | None


def _claim_view(run_id: Any) -> _ClaimView | None:
    run_table, agent_table = (connection.ops.quote_name(m._meta.db_table) for m in (Run, Agent))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {RUN_READ.columns('r')}, a.time_limit_s, ({config_generation_sql(connection)}), "  # noqa: S608 - the models' tables
            f"({token_ceiling_sql('r.id')}) FROM {run_table} r JOIN {agent_table} a ON a.id = r.agent_id WHERE r.id = %s",
            [Run._meta.get_field("id").get_db_prep_value(run_id, connection)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    run = RUN_READ.instance(row)
    assert isinstance(run, Run)
    time_limit_s, generation, ceiling = row[-3:]
    return _ClaimView(
        run=run,
        time_limit_s=int(time_limit_s),
        generation=None if generation is None else str(generation),
        token_ceiling=None if ceiling is None else int(ceiling),
    )


# The run's row, changed by statements made once (audit/row_statements.py): a claim's compare-and-swap (its new
# delivery count and first start computed from what the claim read, which the swap's condition pins), the
# outcome's. It is read with ``agents.selectors.RUN_READ``.
_CLAIM_FIELDS = (
    "status",
    "worker",
    "delivery_count",
    "heartbeat_at",
    "lease_expires_at",
    "started_at",
    "pass_started_at",
)
_CLAIM_QUEUED = RowUpdate(Run, _CLAIM_FIELDS, ("id", "status", "delivery_count", "started_at"))
_CLAIM_LAPSED = RowUpdate(Run, _CLAIM_FIELDS, ("id", "status", "worker", "delivery_count", "lease_expires_at"))
_OUTCOME_FIELDS = (
    "tokens",
    "cost_micros",
    "status",
    "answer",
    "error_code",
    "error_message",
    "deterministic_results",
    "messages",
    "conversation",
    "timings",
    "token_usage",
    "tool_failures",
    "finished_at",
    "lease_expires_at",
)
_OUTCOME = RowUpdate(Run, _OUTCOME_FIELDS, ("id", "status", "worker", "delivery_count"))


def run_claim(*, run_id: str, began: float | None = None) -> RunClaim | None:
    """Claim a run for this worker, compare-and-swap: ``queued → running``, or ``running → running`` when the
    lease of the worker that had it expired. Returns None when there is nothing to do: the run is finished,
    parked, held by a live worker, or gone; or its worker was lost too often (then it is failed, ``worker_lost``:
    ``PLATFORM_RUN_MAX_DELIVERIES`` lost workers, not counting the passes given back for a retry).

    ``began`` (on ``clock``) is when this delivery started, from which the run's time limit counts."""
    began = clock() if began is None else began
    confirmed_at = clock()  # before the claim's lease is counted from ``now``
    view = _claim_view(run_id)
    if view is None:
        logger.warning("run %s does not exist", run_id)
        return None
    run = view.run
    now = timezone.now()
    lease_s = float(lifecycle_setting("PLATFORM_RUN_LEASE_S"))
    me = worker_identity()
    claim_fields: dict[str, Any] = {
        "status": Run.Status.RUNNING,
        "worker": me,
        "delivery_count": run.delivery_count + 1,
        "heartbeat_at": now,
        "lease_expires_at": now + timedelta(seconds=lease_s),
        "started_at": run.started_at or now,
        "pass_started_at": now,
    }
    if run.status == Run.Status.QUEUED:
        claimed = _CLAIM_QUEUED.execute(
            claim_fields,
            {
                "id": run.id,
                "status": Run.Status.QUEUED,
                "delivery_count": run.delivery_count,
                "started_at": run.started_at,  # the first start is kept: the swap fails if it moved since the read
            },
        )
    elif run.status == Run.Status.RUNNING and run.lease_expires_at is not None and run.lease_expires_at <= now:
        previous = {
            "status": Run.Status.RUNNING,
            "worker": run.worker,
            "delivery_count": run.delivery_count,
            "lease_expires_at": run.lease_expires_at,
        }
        losses = run_worker_losses(run_id=run_id, delivery_count=run.delivery_count)
        if losses >= int(lifecycle_setting("PLATFORM_RUN_MAX_DELIVERIES")):
            run_fail_unheld(
                run_id=run_id,
                match=previous,
                error_code="worker_lost",
                error_message=f"the worker running it was lost {losses} times",
            )
            return None
        claimed = _CLAIM_LAPSED.execute(claim_fields, {"id": run.id, **previous})
        if claimed == 1:
            logger.warning("run %s: the lease of %s expired; re-claimed by %s", run_id, run.worker, me)
            approvals_interrupted(run_id=run_id, why="worker_lost")
    else:
        logger.info("run %s is %s (held by %s); nothing to do", run_id, run.status, run.worker or "-")
        return None
    if claimed != 1:
        logger.info("run %s was claimed by another worker first", run_id)
        return None
    for name, value in claim_fields.items():
        setattr(run, name, value)
    soft, _hard = run_time_limits(view.time_limit_s)
    return RunClaim(
        run_id=run_id,
        worker=me,
        delivery=run.delivery_count,
        lease_s=lease_s,
        deadline=began + soft,
        view=view,
        confirmed_at=confirmed_at,
    )


# --- executing --------------------------------------------------------------------------------------------


_TIME_LIMIT_OR_RETRYABLE: tuple[type[BaseException], ...] = (SoftTimeLimitExceeded, *RETRYABLE_ERRORS)


def run_execute(*, run_id: str) -> None:
    """Execute a queued run (or resume one whose approval was decided), or take over one whose worker died.

    Does nothing for a run another live worker holds, or one that has finished. Tool and model failures end the
    run as values (the gate and the engine own them); a soft time limit ends it ``failed`` (``time_limit``); any
    other fault of the pass (setting it up, storing its end) ends it ``failed`` too, on this delivery
    (``_fail_on_fault``). Raises only what a retry can fix (``RETRYABLE_ERRORS``: the database or the broker
    hiccuped), after giving the run back to the queue, so that the task's retry claims it again; the
    ``RETRIED_PASSES_MAX``-th such pass fails the run instead (``_retries_exhausted``) and raises nothing."""
    # The process's audit chainer thread chains the run's events after it (or, for a long run, within
    # AUDIT_CHAIN_HOLD_OFF_S), not in the middle of it.
    with audit_chain_held_off():
        began = clock()
        claim = run_claim(run_id=run_id, began=began)
        if claim is None:
            return
        claim.start_heartbeat()
        try:
            _execute_claimed(claim)
        except SoftTimeLimitExceeded:
            if not claim.fail("time_limit", "the run did not finish within its time limit"):
                _ended_elsewhere(claim)
        except RETRYABLE_ERRORS as exc:
            if not _retries_exhausted(claim, exc):
                logger.warning("run %s: retryable failure; giving the run back to the queue", run_id, exc_info=True)
                claim.release()
                raise
        except Exception as exc:  # noqa: BLE001 - the run ends failed, its cause logged (``_fail_on_fault``)
            _fail_on_fault(claim, exc)
        finally:
            claim.stop_heartbeat()


# The passes of a run (since it was submitted or last resumed) that may end on an error a retry can fix before it
# fails (``retries_exhausted``): as many as the deliveries of its task (``agents.tasks.run_agent``: the first and
# its 5 retries), so that an error every pass meets ends the run when the task stops retrying, rather than leave
# it queued for the reconciler to send again every ``PLATFORM_RUN_QUEUED_STALE_S``, for ever.
RETRIED_PASSES_MAX = 6


def _retries_exhausted(claim: RunClaim, exc: BaseException) -> bool:
    """Whether this pass, ended by ``exc`` (an error a retry can fix), is the run's ``RETRIED_PASSES_MAX``-th such
    pass; if so, the run is failed (``retries_exhausted``, the message naming ``exc``'s class, never its text, which
    may quote what the statement held). False where the passes cannot be counted or the run cannot be failed (the
    database is what fails): the run is given back for a retry, as before."""
    try:
        passes = run_retried_passes(run_id=claim.run_id) + 1
        if passes < RETRIED_PASSES_MAX:
            return False
        message = f"{passes} passes met an error a retry can fix (the last: {type(exc).__name__}); not retried again"
        logger.error("run %s: %s", claim.run_id, message, exc_info=exc)
        if not claim.fail("retries_exhausted", message):
            _ended_elsewhere(claim)
    except DatabaseError as failed:
        logger.warning("run %s: could not end it after its retries (%s)", claim.run_id, type(failed).__name__)
        return False
    return True


def _fail_on_fault(claim: RunClaim, exc: Exception) -> None:
    """A fault of the pass outside the engine, which ends the run as a value itself: setting the pass up (its
    configuration, its model key, its conversation) or storing its end. The run fails now, on this delivery, with
    its reason (``_fault_reason``), and the task ends: raised, it would have left the run ``running`` until its lease
    lapsed, to be delivered again, fail the same way, and end as ``worker_lost``, its cause in the log alone."""
    code, message = _fault_reason(claim, exc)
    logger.error("run %s: its pass failed (%s)", claim.run_id, code, exc_info=exc)
    if not claim.fail(code, message):
        _ended_elsewhere(claim)


def _fault_reason(claim: RunClaim, exc: Exception) -> tuple[str, str]:
    """The error code and stored message of a pass's fault: ``time_limit`` where its time was up (as ``_judged``
    judges an outcome); ``config:secret_unreadable`` where a secret stored in the configuration cannot be
    decrypted (with this process's keys: every delivery would fail the same way); else ``internal``, named by the
    exception's class alone (its text may quote what it read)."""
    if claim.stop_reason == "time_limit" or claim.time_is_up():
        return "time_limit", "the run did not finish within its time limit"
    if isinstance(exc, SecretDecryptionError):
        return SECRET_UNREADABLE, CONFIGURATION_UNREADABLE_MESSAGE
    return "internal", type(exc).__name__


def _ended_elsewhere(claim: RunClaim) -> None:
    """A pass that could not record the run's end because its claim is no longer ours, as one that could not store
    its outcome (``_store_outcome``): cancelled while it ran (a call cut short may have been an approved write), it
    records the run's end, which streams, the admin's live view and ``?wait`` follow the run until; a model call
    under way is counted."""
    if _stopped_by_cancellation(claim):
        RunEventWriter(run_id=claim.run_id, secrets=[]).emit_cancelled()
    _count_late_tokens(claim.run_id)


# How many earlier turns of a conversation (A2A contextId) a run gives the model.
CONVERSATION_TURNS = 10
# The most characters of an earlier question or answer a run gives the model (cut where a reader sees a boundary,
# then marked ``HISTORY_CUT_MARK``), and of the earlier turns together (the newest kept, the oldest dropped first):
# ten earlier answers of any length were sent whole with every call of every later run, and stored with it again.
HISTORY_TEXT_CHARS = 2_000
HISTORY_CHARS = 12_000
HISTORY_CUT_MARK = "…(cut)"
# What is read of a stored question or answer: enough for ``HISTORY_TEXT_CHARS`` composed characters (a syllable
# typed decomposed is up to three), never the whole of a long answer.
_HISTORY_READ_CHARS = HISTORY_TEXT_CHARS * 4


def conversation_history(run: Run) -> list[dict[str, str]]:
    """The earlier turns of the run's conversation: the succeeded runs of the same agent and caller (API key) in
    the conversation its ``context.contextId`` names (A2A's conversation id: ``agents.conversations.in_context``,
    which also finds the run whose own id it is where that run keeps none, as its task reports it), created before
    this one, at most ``CONVERSATION_TURNS``, oldest first, as their stored (masked) question and answer, each cut
    to ``HISTORY_TEXT_CHARS`` and the oldest dropped beyond ``HISTORY_CHARS`` in all. None without a contextId.

    A run with no API key is given the turns of runs that never had one (``run_query``, an admin's run: no request
    digest); an API run always has a digest, so one whose key was deleted since (``Run.api_key`` is SET_NULL) is
    neither given the keyless runs' turns nor (its own caller's being lost with the key) any.

    A shadow run replays its live run, so it is given its live run's history (that caller's live turns before it),
    not the earlier shadows of the contextId: those belong to whichever calls were sampled, of any caller (a shadow
    has no API key).

    An eval run is given the earlier cases of its own eval run that share its contextId (an eval set's cases with
    one contextId are one conversation, in the set's order: ``evals.services.eval_run_submit`` submits a case only
    once the cases before it in its conversation are scored), never the runs of other eval runs (any set, any
    version) nor an eval run made outside one (from code). Its eval run is found through the result that points
    at it (``EvalCaseResult.run``, related name ``eval_results``), read by name: evals stands above agents, which
    never imports it."""
    context_id = (run.context or {}).get("contextId") if isinstance(run.context, dict) else None
    if not context_id:
        return []
    if run.shadow_of_id is not None:
        live = (
            Run.objects.filter(pk=run.shadow_of_id)
            .only("id", "agent_id", "api_key_id", "request_digest", "context", "purpose", "created_at", "shadow_of_id")
            .first()
        )
        # (A live run is never a shadow itself; the check keeps this from ever recursing twice.)
        return conversation_history(live) if live is not None and live.shadow_of_id is None else []
    if run.api_key_id is None and run.request_digest:
        return []  # an API run whose key was deleted
    turns = Run.objects.filter(
        agent_id=run.agent_id,
        api_key_id=run.api_key_id,
        status=Run.Status.SUCCEEDED,
        purpose=run.purpose,
        created_at__lt=run.created_at,
    )
    if run.api_key_id is None:
        turns = turns.filter(request_digest="")  # not the runs of a deleted key
    turns = turns.filter(in_context(turns, str(context_id)))
    if run.purpose == Run.Purpose.EVAL:
        # The runs of a result of the eval run that holds a result of this run.
        turns = turns.filter(eval_results__eval_run__results__run_id=run.pk)
    newest = turns.exclude(pk=run.pk).order_by("-created_at")
    earlier = newest.values_list(Substr("query", 1, _HISTORY_READ_CHARS), Substr("answer", 1, _HISTORY_READ_CHARS))
    kept: list[dict[str, str]] = []
    room = HISTORY_CHARS
    for query, answer in earlier[:CONVERSATION_TURNS]:
        turn = {"query": _history_text(query), "answer": _history_text(answer)}
        room -= len(turn["query"]) + len(turn["answer"])
        if room < 0:
            break
        kept.append(turn)
    return kept[::-1]


def _history_text(text: str) -> str:
    """An earlier question or answer as read (at most ``_HISTORY_READ_CHARS``), cut to ``HISTORY_TEXT_CHARS``
    where a reader sees a boundary and marked where cut. Where the read stopped short of the stored text its last
    cluster may be a part (ᄀ+ᅵ of 김 reads 기): it is dropped."""
    whole = len(text) < _HISTORY_READ_CHARS
    composed = nfc(text)
    kept = grapheme_cut(composed, HISTORY_TEXT_CHARS if whole else min(HISTORY_TEXT_CHARS, len(composed) - 1))
    return kept if whole and kept == composed else kept + HISTORY_CUT_MARK


def _execute_claimed(claim: RunClaim) -> None:
    view = claim.view
    run = view.run
    # The agent, its version, the API key, servers, tools, contracts and rules: this process's copies while the
    # configuration has not changed (agents.config_cache).
    parts = run_parts(run=run, generation=view.generation)
    agent = run.agent = parts.agent
    run.version = parts.version
    configuration = parts.configuration
    # A run of a published version runs its frozen content (prompt, model, rules, contracts); a run of an agent
    # never published runs the agent as it is stored.
    frozen = run.version.content if run.version is not None else None
    settings_of = dict(frozen["agent"]) if frozen else {name: getattr(agent, name) for name in AGENT_FIELDS}
    servers, rules = list(configuration.servers), list(configuration.rules)
    contracts = configuration.contracts
    secrets = [*configuration.server_secrets, *agent.secret_values()]
    # The agent's key is for the endpoint the agent is stored with; a version frozen with another one is not sent it.
    model_api_key = agent.model_api_key()
    moved_endpoint = _version_model_endpoint_moved(run=run, run_settings=settings_of) if model_api_key else None
    # Every binding's secrets, for this process's masking: the gate masks what a server answers with that server's
    # secrets and those registered, and a tool may answer with another binding's token.
    register_secrets(secrets)
    token_ceiling = view.token_ceiling
    # A run's first delivery, never parked before: no event of it exists yet, and no token was spent before it.
    fresh = claim.delivery == 1 and not (run.messages or run.deterministic_results or run.conversation)
    # Settling is needed where the run holds a reservation (taken at admission, so none appears later) or where
    # tokens may have been spent outside this pass's outcome (an earlier delivery or pass).
    settle = token_ceiling is not None or not fresh
    # A run no key submitted (an evaluation's, a shadow's, one made in code) acts as the platform, by its purpose:
    # "local" read as the local tools' server beside it in the audit list.
    actor = f"api_key:{parts.api_key_prefix}" if parts.api_key_prefix is not None else f"system:{run.purpose}"
    writer = RunEventWriter(
        run_id=run.id, secrets=secrets, last_seq=0 if fresh else None, appends_while=claim.may_append
    )
    approvals = RunApprovals(run_id=run.id, actor=actor, secrets=secrets, none_yet=fresh)
    # This event marks the start of the pass: the reconciler counts the time limit from it.
    writer.emit("status", {"status": "running", "delivery": claim.delivery})
    plan = engine.RunPlan(
        run_id=run.id,
        query=run.query,
        context=run.context or {},
        a2a_data=run.a2a_data or [],
        a2a_files=run.a2a_files or [],
        system_prompt=settings_of["system_prompt"],
        deterministic_instruction=settings_of["deterministic_instruction"],
        answer_template=settings_of["answer_template"],
        provider=settings_of["model_provider"],
        model_id=settings_of["model_id"],
        model_params=settings_of["model_params"] or {},
        max_iterations=settings_of["max_iterations"],
        servers=servers,
        rules=rules,
        actor=actor,
        answer_from_deterministic=settings_of["answer_from_deterministic"],
        language=settings_of["language"],
        no_match_answer=settings_of["no_match_answer"],
        mode=settings_of["mode"],
        flow_graph=settings_of["flow_graph"],
        emit=writer.emit,
        emit_many=writer.emit_many,
        approvals=approvals,
        check_cancelled=claim.check,
        time_left=lambda: claim.deadline - clock(),
        conversation=run.conversation or [],
        previous_results=run.deterministic_results or [],
        previous_trace=run.messages or [],
        purpose=run.purpose,
        write_sandbox=frozenset(run.write_sandbox or []),
        tool_selection=settings_of.get("tool_selection") or {},
        parallel_per_run=settings.PLATFORM_PARALLEL_TOOL_CALLS,
        parallel_per_server=settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER,
        mcp_context=settings_of.get("mcp_context") or {},
        model_api_key=None if moved_endpoint else model_api_key,
        token_ceiling=token_ceiling,
        # A run taken over from a lost worker (or resumed): its ceiling counts what its model calls spent already.
        spent_before=_tokens_spent_before(run.id) if token_ceiling is not None and not fresh else 0,
        frozen_contracts=contracts,
        history=conversation_history(run) if not run.conversation else [],
    )
    try:
        # What the run writes for people and for its model (the gate's guidance after a failed call, a budget's
        # or a flow's error) is in the agent's language, not the worker's LANGUAGE_CODE.
        with (
            telemetry.run_span(
                run_id=run.id,
                agent=agent.slug,
                provider=settings_of["model_provider"],  # the model the run calls: its version's, not the draft's
                model=settings_of["model_id"],
            ),
            translation.override(plan.language or translation.get_language()),
            # A call that failed is neither sent again nor handed to its fallback once the run is cancelled.
            gate.run_cancellation(claim.cancelled),
        ):
            if moved_endpoint:
                outcome = _model_endpoint_changed(run=run, version_endpoint=moved_endpoint, secrets=secrets)
            else:
                outcome = engine.execute(plan)
            telemetry.run_outcome(status=outcome.status, error_code=outcome.error_code, token_usage=outcome.token_usage)
    except _TIME_LIMIT_OR_RETRYABLE:
        raise
    except Exception as exc:  # the run must end in a state, whatever happened
        logger.exception("run %s crashed", claim.run_id)
        outcome = engine.RunOutcome(status="failed", error_code="internal", error_message=type(exc).__name__)
        # This outcome counts no token, but the model calls made before the crash were spent: settling counts
        # them from their ``model_turn`` events (a run without a budget too: its ``tokens`` and cost).
        settle = True
    finally:
        # Sessions opened for this run alone (per-run scope) end with it (a resumed run opens new ones).
        get_default_pool().close_scope(f"run:{run.id}")
    # A first pass that asked for no approval has none to leave unused.
    unused = not fresh or approvals.asked
    _store_outcome(claim, run, _judged(claim, outcome), writer, settle=settle, unused=unused, asked=approvals)


# The reason code of a run of a version whose model endpoint is no longer the agent's: a version's content (which
# is exported) never holds the agent's model key, so its run would send the agent's current key, entered for the
# current endpoint, to the version's; it fails before any model request instead.
MODEL_ENDPOINT_CHANGED = "config:model_endpoint_changed"


def _key_endpoint(base_url: str | None) -> str | None:
    """An OpenAI-compatible base URL as its client addresses it: scheme and host as httpx reads them (lower case,
    the scheme's own port left out), the path without its trailing slash (the OpenAI SDK adds one); a URL no client
    takes as it is written. None where there is none."""
    if base_url is None:
        return None
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return base_url
    return str(url.copy_with(path=url.path.rstrip("/") or "/"))


def _base_url(params: Any) -> str | None:
    value = params.get("base_url") if isinstance(params, dict) else None
    return value if isinstance(value, str) and value else None


def _version_model_endpoint_moved(*, run: Run, run_settings: dict[str, Any]) -> str | None:
    """The base URL of the run's version where it is not the agent's (stored) one: the agent's model key would go
    to it (an OpenAI-compatible model sends it there); None otherwise, and for a run of the agent as it is stored,
    or of a model that sends no key (Bedrock reads AWS credentials; the offline and scripted models, none)."""
    if run.version is None or run_settings["model_provider"] != Agent.Provider.OPENAI_COMPATIBLE:
        return None
    frozen = _base_url(run_settings["model_params"])
    if frozen is None or _key_endpoint(frozen) == _key_endpoint(_base_url(run.agent.model_params)):
        return None  # (a version without one fails where its model is made, sending nothing)
    if url_problem(frozen, settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS, target="model"):
        # Refused where its model is made (``model:unavailable``), before any request: that reason is the one to
        # give, as putting the base URL back would be refused too.
        return None
    return frozen


def _model_endpoint_changed(*, run: Run, version_endpoint: str, secrets: list[str]) -> engine.RunOutcome:
    """The failed outcome of a run whose version's model endpoint is no longer the agent's, in the run's language,
    masked; what an earlier pass recorded is kept."""
    assert run.version is not None  # only a version's run has an endpoint of its own
    message = gettext(
        "Version %(number)s sends its model requests to %(endpoint)s, which is no longer the agent's model "
        "endpoint: the agent's model API key is kept for its current endpoint, so the run was not made. Publish a "
        "version with the current endpoint, or set the agent's base_url back to %(endpoint)s."
    ) % {"number": run.version.number, "endpoint": version_endpoint}
    return engine.RunOutcome(
        status="failed",
        error_code=MODEL_ENDPOINT_CHANGED,
        error_message=mask_text(message, secrets=secrets),
        deterministic_results=list(run.deterministic_results or []),
        messages=list(run.messages or []),
        conversation=list(run.conversation or []),
    )


def _tokens_spent_before(run_id: Any) -> int:
    """The tokens the run's model calls spent before this pass, by their ``model_turn`` events (a lost delivery's
    calls have no other record)."""
    spent = run_spent_usage(run_id=run_id)
    return int(spent.get("input_tokens", 0)) + int(spent.get("output_tokens", 0))


def _judged(claim: RunClaim, outcome: engine.RunOutcome) -> engine.RunOutcome:
    """A run stopped by its time limit — between steps, or by Celery's soft limit wherever it landed (the engine
    reports a model step it interrupted as ``model:error``) — fails with ``time_limit``."""
    timed_out = claim.stop_reason == "time_limit" or (outcome.status == "failed" and claim.time_is_up())
    if timed_out:
        outcome.status = "failed"
        outcome.error_code = "time_limit"
        outcome.error_message = "the run did not finish within its time limit"
    return outcome


def _approval_events(run_id: Any) -> list[tuple[str, dict[str, Any]]]:
    """An ``approval`` event for each approval the run waits for: its id, the call (masked arguments) and when it
    expires."""
    pending = Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING).order_by("created_at")
    return [
        (
            "approval",
            {
                "approval_id": str(approval.pk),
                "status": approval.status,
                "mcp_id": approval.mcp_id,
                "tool": approval.tool,
                "call_id": approval.call_id,
                "args": approval.args,
                # As ``GET /runs/{id}`` writes it (DRF's, in the server's zone): one moment, one spelling.
                "expires_at": DateTimeField().to_representation(approval.expires_at),
            },
        )
        for approval in pending
    ]


def _store_outcome(
    claim: RunClaim,
    run: Run,
    outcome: engine.RunOutcome,
    writer: RunEventWriter,
    *,
    settle: bool = True,
    unused: bool = True,
    asked: RunApprovals,
) -> None:
    """Store the outcome and its ``status`` event together, only if the claim is still ours. A run cancelled
    while it ran keeps its cancellation; this worker appends its ``cancelled`` event (``run_cancel`` leaves
    that to the worker). ``settle``: whether the run's budgets need settling (``budget_settle``); a first pass
    of a run without a reservation has nothing to settle, and its stored outcome counts every token it used.
    ``unused``: whether the run may hold approvals it did not carry out (``approvals_unused``) or left claimed
    (``approvals_interrupted``). ``asked``: this pass's approvals; a park waits for those alone (an earlier pass's
    that this one did not ask for again end unused, ``RunApprovals.end_unasked``)."""
    if claim.stop_reason == "lost":
        logger.warning("run %s: %s no longer holds it; its outcome is discarded", claim.run_id, claim.worker)
        _count_late_tokens(claim.run_id)
        return
    event = {"status": outcome.status, "answer": outcome.answer, "error": outcome.error_code or None}
    stored = 0
    if outcome.status != "cancelled":
        finished = outcome.status in {"succeeded", "failed"}
        with transaction.atomic():
            if outcome.status == "awaiting_approval":
                # The run's row first, as a decision takes it before its approval's: an earlier pass's approval
                # decided now either was decided before (and ends unused here) or is found ended (409).
                run_row_lock(claim.run_id)
                asked.end_unasked()  # undone with the rest if the claim is no longer ours
                # What it waits for, before the status: a stream's client learns each approval's id (to decide
                # it with POST /runs/{id}/approvals/{approval_id}) without asking for the run.
                writer.emit_many(_approval_events(claim.run_id))
            # The event first: a reader that sees the run finished also sees its last event (same commit).
            writer.emit("status", event)
            stored = _OUTCOME.execute(
                {
                    **run_usage_fields(run=run, token_usage=outcome.token_usage),
                    "status": outcome.status,
                    "answer": outcome.answer,
                    "error_code": outcome.error_code,
                    "error_message": outcome.error_message,
                    "deterministic_results": outcome.deterministic_results,
                    "messages": outcome.messages,
                    "conversation": outcome.conversation,
                    "timings": _merged_timings(run, outcome.timings),
                    "token_usage": outcome.token_usage,
                    "tool_failures": outcome.tool_failures,
                    "finished_at": timezone.now() if finished else None,
                    "lease_expires_at": None,
                },
                {
                    "id": claim.run_id,
                    "status": Run.Status.RUNNING,
                    "worker": claim.worker,
                    "delivery_count": claim.delivery,
                },
            )
            if stored != 1:
                transaction.set_rollback(True)
            elif outcome.status == "awaiting_approval" and not asked.waiting():
                # Decided while this pass ran on (a reviewer quick on the admin's list): the decision found the run
                # still running and left it to this pass, which queues it again rather than park it for good.
                run_resume(run_id=str(claim.run_id))
            elif finished:
                if unused:
                    # An approved call still claimed (a database error between its send and its record) ends with
                    # its outcome unknown: never sent again, never left "executing".
                    approvals_interrupted(run_id=claim.run_id, why=outcome.status)
                    approvals_unused(run_id=claim.run_id, why=outcome.status)
                if settle:
                    budget_settle(run_id=claim.run_id)
    if stored == 1:
        # After the caller's answer is stored: a live run of an agent with a shadow version may start its shadow
        # (the agent as it was loaded for this run), a shadow is compared.
        shadowed = run.purpose != Run.Purpose.LIVE or run.agent.shadow_version_id is not None
        if outcome.status in {"succeeded", "failed"} and shadowed:
            shadow_after_store(run_id=run.id, purpose=run.purpose)
        return
    if _stopped_by_cancellation(claim):
        writer.emit_cancelled()
    else:
        logger.warning("run %s: %s no longer holds it; its outcome is discarded", claim.run_id, claim.worker)
    _count_late_tokens(claim.run_id)


def _stopped_by_cancellation(claim: RunClaim) -> bool:
    """Whether the run was cancelled while this pass held it; if so, this pass (which stops now) ends the approvals
    it leaves: a call it claimed ends with its outcome unknown, those approved while it ran and never carried out
    are unused."""
    cancelled_while_ours = Run.objects.filter(
        id=claim.run_id, status=Run.Status.CANCELLED, worker=claim.worker, delivery_count=claim.delivery
    ).exists()
    if cancelled_while_ours:
        approvals_interrupted(run_id=claim.run_id, why="cancelled")
        approvals_unused(run_id=claim.run_id, why="cancelled")
    return cancelled_while_ours


def _count_late_tokens(run_id: Any) -> None:
    """This worker's outcome was not stored: the run was cancelled, failed without it (time limit, worker
    presumed lost), or finished by another worker that took it over when this one's lease lapsed; its budgets
    were settled then. A model call that was under way at that moment has written its ``model_turn`` event
    since: settling again counts what it used (``budget_settle`` adds only the difference). A run that has not
    finished (another worker runs it, or it is parked or queued) settles when it ends, and counts the call then.

    The run's row is taken first: a pass storing the run's end holds it until it commits, so this read waits for
    that pass's settlement, which either saw this call's event (written before) or is followed by this one's."""
    finished = [Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED]
    with transaction.atomic():
        run_row_lock(run_id)
        if Run.objects.filter(id=run_id, status__in=finished).exists():
            budget_settle(run_id=run_id)


def _merged_timings(run: Run, timings: dict[str, float]) -> dict[str, float]:
    """A resumed run adds this pass's durations to the earlier ones."""
    merged = dict(run.timings or {})
    for key, value in timings.items():
        merged[key] = round(merged.get(key, 0.0) + value, 2) if key != "queue_wait_ms" else value
    if "queue_wait_ms" not in merged and run.started_at:
        merged["queue_wait_ms"] = round((run.started_at - run.created_at).total_seconds() * 1000, 2)
    return merged
