"""Every refused call is audited: a write whose approval expired leaves one ``approval:expired`` event, whoever
expired it (the periodic expiry, a decision that came too late, the run that found it past its time), and the
gate's refusal that follows is not audited a second time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.approvals import RunApprovals, approvals_expire_due
from agents.models import Approval, Run
from audit.models import AuditEvent
from tests.agents.test_approvals import decide, eager_tasks, lines, notes, park, writer  # noqa: F401  (fixtures)


def expiry_events(run: Run) -> list[tuple[str, str, str, bool, int]]:
    rows = AuditEvent.objects.filter(run_id=run.id, reason="approval:expired").order_by("id")
    return list(rows.values_list("action", "tool", "source", "ok", "attempt"))


@pytest.mark.slow
def test_an_expired_write_leaves_one_audit_event(writer, notes, django_capture_on_commit_callbacks) -> None:  # noqa: F811
    run, _client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire_due() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED  # resumed: the model was told, and the gate refused the call
    assert lines(notes) == []
    assert expiry_events(run) == [("tool.call", "append_note", "agent", False, 0)]
    event = AuditEvent.objects.get(run_id=run.id, reason="approval:expired")
    assert (event.call_id, event.actor) == (approval.call_id, "system")
    assert approvals_expire_due() == 0
    assert len(expiry_events(run)) == 1


@pytest.mark.slow
def test_a_decision_that_comes_too_late_audits_the_expiry_once(
    writer,  # noqa: F811
    notes,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 409
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert lines(notes) == []
    assert expiry_events(run) == [("tool.call", "append_note", "agent", False, 0)]


@pytest.mark.slow
def test_a_run_that_finds_its_approval_past_its_time_audits_the_expiry_once(writer, notes) -> None:  # noqa: F811
    run, _client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    approvals = RunApprovals(run_id=run.id, actor="worker", secrets=[])
    for _ in range(2):
        state = approvals.request(
            mcp_id=approval.mcp_id,
            tool=approval.tool,
            args=approval.exact_args,
            call_id=approval.call_id,
            call_hash=approval.call_hash,
        )
        assert state.status == "expired"
    assert expiry_events(run) == [("tool.call", "append_note", "agent", False, 0)]
