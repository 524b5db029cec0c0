"""What a cancellation leaves behind (defects s29 cancel 3 and 4).

3. The approvals a cancel ended were expired in bulk, with no audit event each (every other path that ends an
   approval audits it): each now ends through ``approvals_unused``, audited ``approval.unused``, and the
   ``run.cancel`` event names them.
4. A run cancelled while it ran could go without its last ``status`` event (``cancelled``), so event streams, the
   admin's live view and ``?wait`` followed it until its hard time limit: (a) a pass stopped by the soft time limit
   after the cancel did not record it; (b) a cancel of a run whose worker is gone (lease lapsed) left it to that
   worker; (c) the reconciler never added it for a worker that died after the cancel.

Races are patched in (rows updated between steps), never waited for.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db.models import QuerySet
from django.utils import timezone

from agent_platform.errors import ApplicationError
from agents import engine
from agents.approvals import approval_decide
from agents.decision_reasons import CANCELLED_APPROVAL
from agents.dispatch import run_time_limits
from agents.execution import run_execute
from agents.models import Agent, Approval, Run, RunEvent
from agents.reconciler import runs_reconcile
from agents.selectors import run_end_recorded
from agents.services import run_cancel
from audit.models import AuditEvent
from tests.agents.test_lifecycle import held_by, status_events

pytestmark = pytest.mark.django_db

CANCELLED = {"status": "cancelled", "answer": "", "error": "cancelled"}


def approval_of(run: Run, status: str, text: str) -> Approval:
    return Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": text},
        exact_args={"text": text},  # type: ignore[misc]
        call_hash=f"h-{text}",
        call_id=f"call-{text}",
        requested_by="local",
        status=status,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def unused_audits(run: Run) -> list[tuple[str, str, str]]:
    rows = AuditEvent.objects.filter(run_id=run.pk, action="approval.unused").order_by("id")
    return [(str(event.result["approval_id"]), event.reason, str(event.result["why"])) for event in rows]  # type: ignore[index]


def running_under(run: Run, *, lease_s: float) -> None:
    held_by(run, "host:1", lease_s=lease_s)
    Run.objects.filter(pk=run.pk).update(pass_started_at=timezone.now())
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running", "delivery": 1})


# --- 3. every approval a cancel ends is audited ---------------------------------------------------------------


def test_cancelling_a_parked_run_audits_each_approval_it_ends(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="메모 두 개 남겨줘", status=Run.Status.AWAITING_APPROVAL)
    first, second = approval_of(run, "pending", "하나"), approval_of(run, "approved", "둘")
    run_cancel(run=run, actor="admin:alice")
    for approval in (first, second):
        approval.refresh_from_db()
        assert (approval.status, approval.reason) == (Approval.Status.EXPIRED, CANCELLED_APPROVAL)
    assert unused_audits(run) == [
        (str(first.pk), "approval:unused", "cancelled"),
        (str(second.pk), "approval:unused", "cancelled"),
    ]
    cancel = AuditEvent.objects.get(run_id=run.pk, action="run.cancel")
    assert (cancel.actor, cancel.args["approvals_expired"]) == ("admin:alice", 2)
    assert cancel.args["approval_ids"] == [str(first.pk), str(second.pk)]


def test_cancelling_a_running_run_audits_the_pending_approval_and_leaves_the_approved_one_to_its_worker(
    demo_agent: Agent,
) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    running_under(run, lease_s=60)
    pending, approved = approval_of(run, "pending", "a"), approval_of(run, "approved", "b")
    run_cancel(run=run, actor="admin:alice")
    assert unused_audits(run) == [(str(pending.pk), "approval:unused", "cancelled")]
    approved.refresh_from_db()
    assert approved.status == Approval.Status.APPROVED  # its live worker may be claiming it


# --- 4a. a pass stopped by its soft time limit after the cancel records the run's end -------------------------


def test_a_pass_cancelled_then_stopped_by_its_soft_time_limit_records_the_runs_end(
    demo_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")

    def a_long_tool_call(plan: Any) -> Any:
        run_cancel(run=Run.objects.get(pk=plan.run_id), actor="admin:alice")  # cancelled while the call runs
        raise SoftTimeLimitExceeded()  # and the call outlasts the soft time limit

    monkeypatch.setattr(engine, "execute", a_long_tool_call)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.CANCELLED, "cancelled")
    assert status_events(run)[-1] == CANCELLED
    assert run_end_recorded(run_id=run.pk)


# --- 4b. a cancel of a run whose worker is gone records its end ----------------------------------------------


def test_cancelling_a_run_whose_lease_lapsed_records_its_end_and_ends_its_approvals(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    running_under(run, lease_s=-5)  # its worker died; nobody has taken the run over yet
    approved, executing = approval_of(run, "approved", "a"), approval_of(run, "executing", "b")
    run_cancel(run=run, actor="admin:alice")
    assert status_events(run)[-1] == CANCELLED
    assert run_end_recorded(run_id=run.pk)
    assert Run.objects.get(pk=run.pk).lease_expires_at is None
    approved.refresh_from_db()
    executing.refresh_from_db()
    assert (approved.status, executing.status) == (Approval.Status.EXPIRED, Approval.Status.OUTCOME_UNKNOWN)
    assert unused_audits(run) == [(str(approved.pk), "approval:unused", "cancelled")]


def test_a_cancel_that_finds_the_lease_renewed_since_it_read_it_leaves_the_end_to_the_live_worker(
    demo_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    running_under(run, lease_s=-1)  # late: its heartbeat is about to renew it
    approved = approval_of(run, "approved", "a")
    first = QuerySet.first
    beats: list[bool] = []

    def read_then_the_heartbeat(queryset: QuerySet[Any]) -> Any:
        row = first(queryset)
        if isinstance(row, dict) and "lease_expires_at" in row and not beats:
            beats.append(True)  # the worker's heartbeat lands between the cancel's read and its swap
            Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=60))
        return row

    monkeypatch.setattr(QuerySet, "first", read_then_the_heartbeat)
    run_cancel(run=run, actor="admin:alice")
    assert beats == [True]
    assert status_events(run)[-1] == {"status": "running", "delivery": 1}  # the live worker records the end
    assert Run.objects.get(pk=run.pk).lease_expires_at is not None
    approved.refresh_from_db()
    assert approved.status == Approval.Status.APPROVED


# --- 4c. the reconciler records the end of a run whose worker died after the cancel ---------------------------


def test_the_reconciler_records_the_end_of_a_run_whose_worker_died_after_the_cancel(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    running_under(run, lease_s=60)
    run_cancel(run=run, actor="admin:alice")  # its live worker is to record the end: it dies instead
    assert status_events(run)[-1] == {"status": "running", "delivery": 1}
    _soft, hard = run_time_limits(demo_agent.time_limit_s)
    assert Run.objects.get(pk=run.pk).lease_expires_at is not None
    runs_reconcile(now=timezone.now() + timedelta(seconds=hard - 5))  # the worker may still be finishing its call
    assert status_events(run)[-1] == {"status": "running", "delivery": 1}
    runs_reconcile(now=timezone.now() + timedelta(seconds=hard + 5))
    assert status_events(run)[-1] == CANCELLED
    assert Run.objects.get(pk=run.pk).lease_expires_at is None
    runs_reconcile(now=timezone.now() + timedelta(seconds=hard + 10))
    assert status_events(run).count(CANCELLED) == 1


def test_the_reconciler_adds_no_second_end_where_the_worker_recorded_it(
    demo_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")

    def a_long_tool_call(plan: Any) -> Any:
        run_cancel(run=Run.objects.get(pk=plan.run_id), actor="admin:alice")
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(engine, "execute", a_long_tool_call)
    run_execute(run_id=str(run.id))
    assert status_events(run).count(CANCELLED) == 1
    _soft, hard = run_time_limits(demo_agent.time_limit_s)
    runs_reconcile(now=timezone.now() + timedelta(seconds=hard + 5))
    assert status_events(run).count(CANCELLED) == 1
    assert Run.objects.get(pk=run.pk).lease_expires_at is None


# --- 5. a finished run's approval is not decided -----------------------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_pending_approval_of_a_cancelled_run_is_refused_and_ends_unused(demo_agent: Agent, decision: str) -> None:
    """One a worker asked for after the cancel, or a dead worker left behind: it was approved (200, "the run
    resumes") for a run that never resumed, and read "approved" for a call never made."""
    run = Run.objects.create(agent=demo_agent, query="메모 남겨줘", status=Run.Status.CANCELLED)
    pending, approved = approval_of(run, "pending", "하나"), approval_of(run, "approved", "둘")
    with pytest.raises(ApplicationError) as refused:
        approval_decide(run=run, approval_id=str(pending.pk), decision=decision, actor="admin:kim")
    assert (refused.value.status, refused.value.code) == (409, "run_finished")
    pending.refresh_from_db()
    assert pending.status == Approval.Status.EXPIRED
    assert unused_audits(run) == [(str(pending.pk), "approval:unused", "run_finished")]
    assert not AuditEvent.objects.filter(run_id=run.pk, action=f"approval.{decision}").exists()
    assert Approval.objects.get(pk=approved.pk).status == Approval.Status.APPROVED  # another's end is not this one's
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED


# --- 4d. one end, whoever records it ---------------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["soft_time_limit", "returns"])
def test_a_worker_paused_past_its_lease_adds_no_second_end_to_a_run_its_cancel_ended(
    demo_agent: Agent, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    real_execute = engine.execute

    def a_call_paused_past_the_lease(plan: Any) -> Any:
        # The worker's process stalls in its call past its lease; a cancel then finds no live worker and records
        # the run's end itself. The worker wakes and stops: it must not record that end a second time.
        Run.objects.filter(pk=plan.run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        run_cancel(run=Run.objects.get(pk=plan.run_id), actor="admin:alice")
        assert status_events(run).count(CANCELLED) == 1
        if stop == "soft_time_limit":
            raise SoftTimeLimitExceeded()
        return real_execute(plan)

    monkeypatch.setattr(engine, "execute", a_call_paused_past_the_lease)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.CANCELLED, "cancelled")
    assert status_events(run).count(CANCELLED) == 1
    assert status_events(run)[-1] == CANCELLED
    assert run_end_recorded(run_id=run.pk)
