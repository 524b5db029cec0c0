"""A call a person was asked about is governed by its approval, whatever its tool's risk became while it waited;
the dashboard's approvals panel shows an approval past its expiry as expired and links no page its reader cannot
open; an approval's History page is a record's."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from agents.approvals import RunApprovals, approvals_expire_due
from agents.models import Approval, Run
from agents.run_state import run_resume
from audit.models import AuditEvent
from mcpregistry.models import ToolContract
from mcpregistry.services import tool_contract_update
from tests.agents import test_approvals
from tests.agents.test_admin_runs import a_run, an_approval
from tests.agents.test_approvals import decide, lines, park
from tests.conftest import logged_in
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db(transaction=False)

# The approvals' own fixtures: tasks run eagerly; an agent whose model writes a note, and the notes file.
eager_tasks, writer, notes = test_approvals.eager_tasks, test_approvals.writer, test_approvals.notes


def marked_read() -> None:
    """An admin marks the parked call's tool ``read`` while its approval waits."""
    contract = ToolContract.objects.get(tool__server__mcp_id="notes", tool__name="append_note")
    tool_contract_update(contract=contract, actor="admin:x", via="admin", data={"risk": "read"})


def tool_calls(run: Run) -> list[tuple[bool, str]]:
    return list(AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id").values_list("ok", "reason"))


# --- a call asked for as a write stays one -------------------------------------------------------------------


@pytest.mark.slow
def test_a_rejected_write_is_not_made_when_its_tool_is_marked_read_while_it_waits(
    writer,
    notes: Path,
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    marked_read()
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "안 됩니다").status_code == 200
    run.refresh_from_db()
    approval.refresh_from_db()
    assert lines(notes) == []
    assert approval.status == Approval.Status.REJECTED
    assert "approval:rejected" in run.answer
    assert tool_calls(run) == []  # the rejection is the approval's event; nothing was sent


@pytest.mark.slow
def test_an_expired_write_is_not_made_when_its_tool_is_marked_read_while_it_waits(
    writer,
    notes: Path,
    django_capture_on_commit_callbacks,
) -> None:
    run, _client = writer
    approval = park(run)
    marked_read()
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire_due() == 1
    run.refresh_from_db()
    approval.refresh_from_db()
    assert lines(notes) == []
    assert approval.status == Approval.Status.EXPIRED
    assert "approval:expired" in run.answer
    assert tool_calls(run) == [(False, "approval:expired")]


@pytest.mark.slow
def test_an_approved_write_is_made_once_as_approved_when_its_tool_is_marked_read_while_it_waits(
    writer,
    notes: Path,
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    marked_read()
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve", "좋아요").status_code == 200
    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # Sent with the approval's idempotency key, claimed and recorded: executed, not left unused.
    assert lines(notes) == [f"회의록 저장\t{run.id}:{approval.pk}"]
    assert approval.status == Approval.Status.EXECUTED
    assert approval.result is not None and approval.result["ok"] is True
    assert tool_calls(run) == [(True, "")]


@pytest.mark.slow
def test_a_waiting_write_still_waits_when_its_tool_is_marked_read_and_the_run_resumes(
    writer,
    notes: Path,
    django_capture_on_commit_callbacks,
) -> None:
    run, _client = writer
    approval = park(run)
    marked_read()
    with django_capture_on_commit_callbacks(execute=True):
        assert run_resume(run_id=str(run.id))  # resumed for another reason: the pass replays the parked call
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert list(run.approvals.values_list("pk", "status")) == [(approval.pk, Approval.Status.PENDING)]
    assert lines(notes) == []
    assert tool_calls(run) == []


def test_a_pass_reads_the_runs_approvals_once_for_all_its_read_calls(django_assert_num_queries) -> None:
    run = a_run(status=Run.Status.RUNNING)
    approval = an_approval(run)
    Approval.objects.filter(pk=approval.pk).update(args={"text": "회의록 저장"})  # as the model's call replays them
    approvals = RunApprovals(run_id=run.id, actor="worker", secrets=[])
    asked = {"mcp_id": "notes", "tool": "append_note", "args": {"text": "회의록 저장"}, "call_hash": approval.call_hash}
    with django_assert_num_queries(1):
        assert approvals.asked_for(**asked, call_id=approval.call_id)
        assert not approvals.asked_for(**asked, call_id="call-other")
        # Another tool under the call's id (a read fallback the gate calls under it) is not the approval's call.
        assert not approvals.asked_for(**{**asked, "tool": "read_notes"}, call_id=approval.call_id)


def test_a_read_call_of_a_run_without_approvals_costs_one_query_per_pass(django_assert_num_queries) -> None:
    run = a_run(status=Run.Status.RUNNING)
    approvals = RunApprovals(run_id=run.id, actor="worker", secrets=[])
    with django_assert_num_queries(1):
        for number in range(3):
            assert not approvals.asked_for(
                mcp_id="notes", tool="read_notes", args={}, call_id=f"call_{number}", call_hash="0" * 64
            )


# --- the dashboard's approvals ---------------------------------------------------------------------------------


def test_the_dashboard_shows_an_approval_past_its_expiry_as_expired_with_no_decision(admin_client: Client) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    overdue = an_approval(run, minutes_ago=90)
    Approval.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(minutes=5))
    waiting = an_approval(run, minutes_ago=1)
    page = admin_client.get("/admin/").content.decode()
    assert '<span class="badge badge-pending">1</span>' in page  # only the one that still waits
    assert f"/admin/agents/approval/{waiting.pk}/decide/approve/" in page
    assert f"/admin/agents/approval/{overdue.pk}/decide/" not in page
    row = re.search(rf'<tr class="([^"]+)" data-approval="{overdue.pk}">(.*?)</tr>', page, re.S)
    assert row is not None and row.group(1) == "expired-approval"
    assert str(Approval.Status.EXPIRED.label) in row.group(2)
    assert f"/admin/agents/approval/{overdue.pk}/change/" in row.group(2)


def test_the_dashboard_links_no_run_page_to_an_approver_who_may_not_view_runs() -> None:
    approver = logged_in(staff("approver", perms=("agents.view_approval", "agents.change_approval")))
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    approval = an_approval(run)
    page = approver.get("/admin/").content.decode()
    assert f"/admin/agents/approval/{approval.pk}/decide/approve/" in page
    assert f"/admin/agents/run/{run.pk}/" not in page
    assert str(run.pk)[:8] in page  # the run is still named
    for link in set(re.findall(r'href="(/admin/[^"]+)"', page)):
        assert approver.get(link.replace("&amp;", "&")).status_code < 400, link


def test_the_dashboard_links_the_run_page_to_whoever_may_view_runs(admin_client: Client) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    an_approval(run)
    assert f'href="/admin/agents/run/{run.pk}/change/"' in admin_client.get("/admin/").content.decode()


# --- an approval's History page ---------------------------------------------------------------------------------


def test_an_approvals_history_page_is_a_records_page(admin_client: Client) -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    response = admin_client.get(f"/admin/agents/approval/{approval.pk}/history/")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="history-note"' in page and "pending → approved → executing → executed" in page
    assert "added via this admin site" not in page


def test_an_approvals_history_page_is_refused_to_whoever_may_not_view_approvals() -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    outsider = logged_in(staff("outsider", perms=("agents.view_run",)))
    assert outsider.get(f"/admin/agents/approval/{approval.pk}/history/").status_code == 403
