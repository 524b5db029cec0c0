"""Approvals decided, expired or resumed at awkward moments: the run never stays parked with nothing to wait for,
and a pass just claimed is never taken for an old one. The writer agent and its notes server are those of
``test_approvals``; the interleavings are made by running the real functions in the order that races would."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

import agents.approvals as approvals_module
from agents import execution
from agents.approvals import approval_decide, approvals_expire_due
from agents.models import Approval, Run, RunEvent
from agents.reconciler import runs_reconcile
from tests.agents import test_approvals
from tests.agents.test_approvals import decide, lines, park

# test_approvals' fixtures: the writer agent with its notes server, tasks run in-process.
writer, notes, eager_tasks = test_approvals.writer, test_approvals.notes, test_approvals.eager_tasks

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.mark.slow
def test_a_decision_taken_while_the_pass_that_asked_still_runs_is_not_lost(
    writer, notes, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    # A reviewer approves the moment the approval appears, before the pass has stored the run as parked: the
    # decision finds the run still running and cannot queue it; the pass, storing its park, finds nothing pending.
    run, _client = writer
    store = execution._store_outcome

    def decided_before_the_park_is_stored(claim, *args, **kwargs):  # type: ignore[no-untyped-def]
        for approval in Approval.objects.filter(run_id=claim.run_id, status=Approval.Status.PENDING):  # its park
            approval_decide(
                run=Run.objects.get(pk=claim.run_id),
                approval_id=str(approval.pk),
                decision="approve",
                actor="admin:quick",
            )
        return store(claim, *args, **kwargs)

    monkeypatch.setattr(execution, "_store_outcome", decided_before_the_park_is_stored)
    with django_capture_on_commit_callbacks(execute=True):
        execution.run_execute(run_id=str(run.id))
    monkeypatch.setattr(execution, "_store_outcome", store)
    run.refresh_from_db()
    # Queued again by the pass and executed (eager tasks): the approved write made once, the run answered.
    assert run.status == Run.Status.SUCCEEDED, (run.status, run.error_message)
    assert len(lines(notes)) == 1
    assert Approval.objects.get(run_id=run.id).status == Approval.Status.EXECUTED


@pytest.mark.slow
def test_the_reconciler_queues_a_parked_run_with_no_approval_pending(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    # A run left parked on an approval already decided (by an older version's race, a restored backup).
    run, _client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.APPROVED, decided_by="admin:x")
    with django_capture_on_commit_callbacks(execute=True):
        report = runs_reconcile()
    assert report.parked_resumed == 1
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert len(lines(notes)) == 1
    # A run parked on a pending approval is left alone.
    assert runs_reconcile().parked_resumed == 0


@pytest.mark.slow
def test_an_expiry_and_its_runs_resumption_are_one_transaction(
    writer, notes, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    run, _client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    resume = approvals_module.run_resume

    def locked(**kwargs):  # type: ignore[no-untyped-def]
        raise OperationalError("database is locked")

    monkeypatch.setattr(approvals_module, "run_resume", locked)
    with pytest.raises(OperationalError):
        approvals_expire_due()
    monkeypatch.setattr(approvals_module, "run_resume", resume)
    # Nothing of the failed expiry stayed: the approval is still pending, to expire at the next pass.
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire_due() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "제한 시간 내에 승인되지 않았습니다" in run.answer  # the model was told
    assert lines(notes) == []


@pytest.mark.slow
def test_a_resumed_pass_just_claimed_is_not_failed_for_the_time_its_run_was_parked(writer, notes) -> None:
    run, client = writer
    approval = park(run)
    # The person decided ten minutes later; the agent's time limit is much shorter.
    assert run.agent.time_limit_s < 600
    RunEvent.objects.filter(run_id=run.id).update(created_at=timezone.now() - timedelta(minutes=10))
    assert decide(client, run, approval, "approve").status_code == 200  # queued (its task not run here)
    claim = execution.run_claim(run_id=str(run.id))
    assert claim is not None
    # A reconciler pass lands between the claim and the pass's first event.
    assert runs_reconcile().timed_out == 0
    claim.start_heartbeat()
    try:
        execution._execute_claimed(claim)
    finally:
        claim.stop_heartbeat()
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.status, run.error_code)
    assert len(lines(notes)) == 1


def _approved_and_claimed(run: Run, client) -> Approval:  # type: ignore[no-untyped-def]
    """The run parked, its write approved, and a worker's pass sending it (the approval claimed, ``executing``)."""
    approval = park(run)
    assert decide(client, run, approval, "approve").status_code == 200  # queued (its task not run here)
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.EXECUTING)
    return approval


@pytest.mark.slow
def test_a_pass_cut_short_after_its_run_was_cancelled_ends_the_call_it_claimed(writer, notes, monkeypatch) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    from agents.services import run_cancel

    run, client = writer
    approval = _approved_and_claimed(run, client)

    def cancelled_then_cut_short(claim):  # type: ignore[no-untyped-def]
        run_cancel(run=Run.objects.get(pk=claim.run_id), actor="admin:x")  # while the write is out
        raise SoftTimeLimitExceeded()  # the pass is stopped mid-call

    monkeypatch.setattr(execution, "_execute_claimed", cancelled_then_cut_short)
    execution.run_execute(run_id=str(run.id))
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN  # not "executing" for good; never sent again
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED


@pytest.mark.slow
def test_the_reconciler_ends_what_a_dead_worker_left_claimed_on_a_finished_run(writer, notes) -> None:
    from agents.services import run_cancel
    from audit.models import AuditEvent

    run, client = writer
    approval = _approved_and_claimed(run, client)
    assert execution.run_claim(run_id=str(run.id)) is not None
    run_cancel(run=Run.objects.get(pk=run.pk), actor="admin:x")
    # The worker's process was killed mid-call: nothing of it runs again.
    assert runs_reconcile().approvals_ended == 0  # within the run's hard time limit, its worker may still finish
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(hours=1))
    assert runs_reconcile().approvals_ended == 1
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert AuditEvent.objects.filter(run_id=run.id, action="approval.outcome_unknown").count() == 1
    assert runs_reconcile().approvals_ended == 0


@pytest.mark.slow
def test_a_sandboxed_write_is_not_sent_again_when_its_pass_is_made_again(writer, notes, monkeypatch) -> None:
    # An eval run may write on its sandbox server without a person; the model names the call anew on each pass.
    from django.db import OperationalError as DatabaseHiccup

    run, _client = writer
    Run.objects.filter(pk=run.pk).update(purpose=Run.Purpose.EVAL, write_sandbox=["notes"])
    store = execution._store_outcome
    stores = []

    def the_first_store_fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        stores.append(1)
        if len(stores) == 1:
            raise DatabaseHiccup("server closed the connection unexpectedly")  # the outcome's commit
        return store(*args, **kwargs)

    monkeypatch.setattr(execution, "_store_outcome", the_first_store_fails)
    with pytest.raises(DatabaseHiccup):
        execution.run_execute(run_id=str(run.id))  # given back to the queue; the task's retry runs it again
    execution.run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.status, run.error_message)
    assert len(lines(notes)) == 1
    [approval] = Approval.objects.filter(run_id=run.id)
    assert approval.status == Approval.Status.EXECUTED


@pytest.mark.slow
def test_a_secret_written_in_a_decisions_reason_is_masked(writer, notes, django_capture_on_commit_callbacks) -> None:
    # The notes server's environment is its secret (here, the file's path); a reviewer pastes it in the reason.
    run, client = writer
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", f"이 값 때문에: {notes}").status_code == 200
    approval.refresh_from_db()
    run.refresh_from_db()
    assert str(notes) not in approval.reason and "***" in approval.reason
    assert str(notes) not in run.answer
