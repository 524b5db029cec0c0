"""Deciding a write call where a stored secret cannot be decrypted with this process's keys
(``mcpregistry.crypto.UnreadableSecrets``: a restored dump, a dropped key).

1. The run's agent or a bound server holds such a secret: a rejection needs none and goes through (its reason
   masked with every secret that can be read); an approval is refused as a submission is, a 503
   ``config:secret_unreadable``, and stays pending. The REST API and the admin answered a 500 to both.
2. The approval's own exact arguments are such a secret: an approval is refused at once (503); a rejection stays a
   rejection, told to the model as one; a call approved before its arguments became unreadable is never sent and
   fails with ``config:secret_unreadable``, for the model and the audit alike (it failed as ``unexpected``, naming
   ``SecretDecryptionError``, and a rejection was told as an unexpected failure).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.test import Client

from agents.approvals import RunApprovals
from agents.execution import run_execute
from agents.models import Approval, Run
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_approvals import decide, eager_tasks, lines, notes, park, writer  # noqa: F401  (fixtures)
from tests.agents.test_poisoned_runs import UNREADABLE, poison_agent, store_foreign

READABLE_TOKEN = "tok-readable-0123456789"  # a test's stand-in for a server's credential


def status_of(approval: Approval) -> str:
    return Approval.objects.filter(pk=approval.pk).values_list("status", flat=True).get()


def audit_reasons(run: Run) -> list[str]:
    return list(AuditEvent.objects.filter(run_id=run.id).order_by("id").values_list("reason", flat=True))


def with_a_readable_credential(run: Run, notes_path: Any) -> None:
    """The notes server gets a credential this process can read (what a rejection's reason is masked with)."""
    server = run.agent.servers.get()
    server.env = {"NOTES_FILE": str(notes_path), "NOTES_TOKEN": READABLE_TOKEN}
    server.save()


def assert_refused_as_unreadable(response: Any) -> None:
    assert response.status_code == 503, response.content
    error = response.json()["error"]
    assert error["code"] == UNREADABLE
    assert "SECRETS_ENCRYPTION_KEYS" in error["message"]
    assert int(response["Retry-After"]) > 0


# --- 1. the run's agent or server cannot be read ----------------------------------------------------------------


@pytest.mark.slow
def test_a_call_of_an_agent_whose_secret_cannot_be_read_is_rejected_its_reason_masked(
    writer,  # noqa: F811
    notes,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    with_a_readable_credential(run, notes)
    poison_agent(run.agent)

    with django_capture_on_commit_callbacks(execute=True):
        response = decide(client, run, approval, "reject", f"토큰 {READABLE_TOKEN} 이 보입니다")

    assert response.status_code == 200, response.content
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED
    assert READABLE_TOKEN not in approval.reason and "토큰" in approval.reason
    decision = AuditEvent.objects.get(run_id=run.id, action="approval.reject")
    assert READABLE_TOKEN not in str(decision.result)
    assert lines(notes) == []
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, UNREADABLE)  # resumed, it meets the agent's key


@pytest.mark.slow
def test_approving_a_call_of_an_agent_whose_secret_cannot_be_read_is_a_503_and_leaves_it_pending(
    writer,  # noqa: F811
    notes,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    token = poison_agent(run.agent)

    with django_capture_on_commit_callbacks(execute=True):
        response = decide(client, run, approval, "approve")

    assert_refused_as_unreadable(response)
    assert token[10:40] not in response.content.decode()
    assert status_of(approval) == Approval.Status.PENDING
    assert not AuditEvent.objects.filter(run_id=run.id, action="approval.approve").exists()
    assert Run.objects.get(pk=run.pk).status == Run.Status.AWAITING_APPROVAL
    assert lines(notes) == []


@pytest.mark.slow
def test_a_server_whose_secret_cannot_be_read_refuses_the_approval_and_lets_the_rejection_through(
    writer,  # noqa: F811
    notes,  # noqa: F811
) -> None:
    run, client = writer
    approval = park(run)
    store_foreign(McpServer, "env", run.agent.servers.get().pk, {"NOTES_FILE": str(notes)})

    assert_refused_as_unreadable(decide(client, run, approval, "approve"))
    assert status_of(approval) == Approval.Status.PENDING

    assert decide(client, run, approval, "reject", "필요 없음").status_code == 200
    assert status_of(approval) == Approval.Status.REJECTED


@pytest.mark.slow
def test_the_admin_says_why_it_cannot_approve_and_still_rejects(writer, notes) -> None:  # noqa: F811
    run, _client = writer
    approval = park(run)
    poison_agent(run.agent)
    browser = Client()
    browser.force_login(get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only"))

    refused = browser.post(f"/admin/agents/approval/{approval.pk}/decide/approve/", {"reason": ""})

    assert refused.status_code == 302
    assert any("SECRETS_ENCRYPTION_KEYS" in str(message) for message in get_messages(refused.wsgi_request))
    assert status_of(approval) == Approval.Status.PENDING
    rejected = browser.post(f"/admin/agents/approval/{approval.pk}/decide/reject/", {"reason": "필요 없음"})
    assert rejected.status_code == 302
    assert status_of(approval) == Approval.Status.REJECTED


# --- 2. the approval's own exact arguments cannot be read -----------------------------------------------------


@pytest.mark.slow
def test_approving_a_call_whose_exact_arguments_cannot_be_read_is_refused_at_once(
    writer,  # noqa: F811
    notes,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    store_foreign(Approval, "exact_args", approval.pk, {"text": "회의록 저장"})

    with django_capture_on_commit_callbacks(execute=True):
        response = decide(client, run, approval, "approve")

    assert_refused_as_unreadable(response)
    assert "reject" in response.json()["error"]["message"]  # what the caller can still do
    assert status_of(approval) == Approval.Status.PENDING
    assert lines(notes) == []


@pytest.mark.slow
def test_a_rejected_call_whose_exact_arguments_cannot_be_read_is_told_as_a_rejection(
    writer,  # noqa: F811
    notes,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    approval = park(run)
    store_foreign(Approval, "exact_args", approval.pk, {"text": "회의록 저장"})

    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "거부했습니다" in run.answer and "필요 없음" in run.answer
    assert "SecretDecryptionError" not in run.answer
    assert "unexpected" not in audit_reasons(run)
    assert lines(notes) == []


@pytest.mark.slow
def test_an_approved_call_whose_exact_arguments_became_unreadable_is_never_sent_and_fails_as_such(
    writer,  # noqa: F811
    notes,  # noqa: F811
) -> None:
    run, client = writer
    approval = park(run)
    assert decide(client, run, approval, "approve").status_code == 200  # not resumed yet: nothing commits here
    store_foreign(Approval, "exact_args", approval.pk, {"text": "회의록 저장"})

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert lines(notes) == []
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert UNREADABLE in run.answer and "SecretDecryptionError" not in run.answer  # the model was told why
    reasons = audit_reasons(run)
    assert "unexpected" not in reasons
    refusal = AuditEvent.objects.get(run_id=run.id, action="tool.call", reason=UNREADABLE)
    assert (refusal.tool, refusal.ok, refusal.call_id) == ("append_note", False, approval.call_id)
    # The run ended without making the call: its approval reads so, never "approved" or "executed".
    assert status_of(approval) == Approval.Status.EXPIRED


@pytest.mark.slow
def test_a_pass_made_again_finds_the_same_failure_and_audits_it_once(writer, notes) -> None:  # noqa: F811
    run, client = writer
    approval = park(run)
    assert decide(client, run, approval, "approve").status_code == 200
    store_foreign(Approval, "exact_args", approval.pk, {"text": "회의록 저장"})
    approvals = RunApprovals(run_id=run.id, actor="worker", secrets=[])

    assert approvals.approved_args(call_id=approval.call_id, args={"text": "회의록 저장"}) is None
    states = [
        approvals.request(
            mcp_id=approval.mcp_id,
            tool=approval.tool,
            args={"text": "회의록 저장"},
            call_id=approval.call_id,
            call_hash=approval.call_hash,
        )
        for _ in range(2)
    ]

    assert states[0] == states[1]
    assert states[0].args is None
    assert states[0].result is not None and states[0].result["reason"] == UNREADABLE
    assert audit_reasons(run).count(UNREADABLE) == 1
