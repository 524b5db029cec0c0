"""A run's approvals across its passes (appr2's defects).

1. A pass made again (its first store failed and was retried) asks the model again, which may give another write
   the first call's id (``call_0``): it gets an approval of its own, and what is approved is what is sent and
   recorded (the conversation, the run's tool calls, the audit); an approved call's recorded arguments are the
   ones sent, also where they are not the arguments of the call that found the approval (a rule edited since).
2. The approvals an earlier pass asked for and the pass that parks did not ask again end unused as it parks: the
   run lists and waits for its own alone (a stale one approved answers 409, never "the run resumes"), and a
   decision on its own taken while it ran queues it again.
3. A decision's reason over 2,000 characters is refused (the admin's form, the service), never stored cut.

The writer agent and its notes server are ``test_approvals``'; the interleavings are made by patching in the
store's failure and the reviewer's timing."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import OperationalError
from django.test import Client

from agent_platform.errors import ApplicationError
from agents import execution
from agents.approvals import approval_decide
from agents.decision_reasons import ASKED_AGAIN_APPROVAL
from agents.llm import ScriptedChatModel
from agents.models import Agent, Approval, DeterministicRule, Run
from audit.models import AuditEvent
from tests.agents import test_approvals
from tests.agents.test_approvals import a_rule_that_saves_the_notes, decide, lines, park

# test_approvals' fixtures: the writer agent with its notes server, tasks run in-process.
writer, notes, eager_tasks = test_approvals.writer, test_approvals.notes, test_approvals.eager_tasks

pytestmark = pytest.mark.django_db(transaction=False)

REASON_MAX_CHARS = 2000  # the REST API's limit on a decision's reason (``agents.approvals.REASON_MAX_CHARS``)


def the_first_store_fails(monkeypatch: pytest.MonkeyPatch, before_the_second: Any = None) -> None:
    """The first pass's outcome is never stored (its commit fails: the task gives the run back to the queue);
    ``before_the_second`` runs as the second pass starts storing its own."""
    store = execution._store_outcome
    stores: list[int] = []

    def failing_once(claim, *args, **kwargs):  # type: ignore[no-untyped-def]
        stores.append(1)
        if len(stores) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        if len(stores) == 2 and before_the_second is not None:
            before_the_second(claim)
        return store(claim, *args, **kwargs)

    monkeypatch.setattr(execution, "_store_outcome", failing_once)


def passes_made_twice(run: Run) -> None:
    with pytest.raises(OperationalError):
        execution.run_execute(run_id=str(run.id))
    execution.run_execute(run_id=str(run.id))


# ---- 1. a call id the model gives again, with other arguments ---------------------------------------------------


@pytest.mark.slow
def test_a_pass_made_again_whose_model_gives_another_write_the_same_id_asks_for_that_write(
    writer, notes, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    run, client = writer
    answers = iter(["A: 100원 송금", "B: 100만원 송금"])

    def a_model_that_answers_otherwise_when_asked_again(self, before):  # type: ignore[no-untyped-def]
        if len(before) == 1:
            return {"tool_calls": [{"name": "append_note", "args": {"text": next(answers)}, "id": "call_0"}]}
        return {"content": "결과: {last_tool_result}"}

    monkeypatch.setattr(ScriptedChatModel, "_turn_for", a_model_that_answers_otherwise_when_asked_again)
    the_first_store_fails(monkeypatch)
    passes_made_twice(run)

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    first, second = Approval.objects.filter(run=run).order_by("created_at")
    assert (first.call_id, first.args, first.status) == ("call_0", {"text": "A: 100원 송금"}, "expired")
    assert (second.call_id, second.args, second.status) == ("call_0", {"text": "B: 100만원 송금"}, "pending")
    # What the person is shown is what the conversation holds, and is what runs.
    listed = client.get(f"/api/v1/runs/{run.id}").json()["approvals"]
    assert [(a["id"], a["args"]) for a in listed if a["status"] == "pending"] == [(str(second.id), second.args)]
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, second, "approve").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # Keyed by its own approval (never by the model's call id, which named the first write too).
    assert lines(notes) == [f"B: 100만원 송금\t{run.id}:{second.pk}"]
    # What was sent is recorded: the approved arguments and the idempotency key the gate wrote into them.
    sent_args = {"text": "B: 100만원 송금", "idempotency_key": f"{run.id}:{second.pk}"}
    [call] = client.get(f"/api/v1/runs/{run.id}").json()["tool_calls"]
    assert (call["args"], call["ok"]) == (sent_args, True)
    sent = AuditEvent.objects.get(run_id=run.id, action="tool.call", ok=True)
    assert sent.args == sent_args
    approved = AuditEvent.objects.get(run_id=run.id, action="approval.approve")
    assert approved.args == {"text": "B: 100만원 송금"}


@pytest.mark.slow
def test_a_sandboxed_write_made_again_under_its_id_with_other_arguments_is_not_told_the_first_ones_outcome(
    writer, notes, monkeypatch
) -> None:
    run, _client = writer
    Run.objects.filter(pk=run.pk).update(purpose=Run.Purpose.EVAL, write_sandbox=["notes"])
    answers = iter(["A", "B"])

    def a_model_that_answers_otherwise_when_asked_again(self, before):  # type: ignore[no-untyped-def]
        if len(before) == 1:
            return {"tool_calls": [{"name": "append_note", "args": {"text": next(answers)}, "id": "call_0"}]}
        return {"content": "결과: {last_tool_result}"}

    monkeypatch.setattr(ScriptedChatModel, "_turn_for", a_model_that_answers_otherwise_when_asked_again)
    the_first_store_fails(monkeypatch)
    passes_made_twice(run)

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # The second write was sent (its own outcome told to the model), not answered with the first one's.
    assert [line.split("\t")[0] for line in lines(notes)] == ["A", "B"]
    assert "notes: 2" in run.answer
    assert sorted(Approval.objects.filter(run=run).values_list("args__text", "status")) == [
        ("A", "executed"),
        ("B", "executed"),
    ]


@pytest.mark.slow
def test_an_approved_call_records_the_arguments_it_sent_not_those_of_the_call_that_found_it(
    writer, notes, django_capture_on_commit_callbacks
) -> None:
    # A rule's call keeps its approval under its id: edited while the run waits, the rule's new parameters are not
    # what the person approved, and the approved ones are sent. What the run records is what was sent.
    run, client = writer
    a_rule_that_saves_the_notes(run)
    approval = park(run)
    DeterministicRule.objects.filter(agent=run.agent).update(params={"text": "규칙이 바뀜"})
    Agent.objects.filter(pk=run.agent_id).update(name="notes (rule edited)")  # a new configuration generation
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 200
    run.refresh_from_db()
    assert [line.split("\t")[0] for line in lines(notes)] == ["규칙이 저장"]
    [result] = run.deterministic_results
    sent_args = {"text": "규칙이 저장", "idempotency_key": lines(notes)[0].split("\t")[1]}  # the gate's key, as sent
    assert result["args"] == sent_args
    sent = AuditEvent.objects.get(run_id=run.id, action="tool.call", ok=True)
    assert sent.args == sent_args


# ---- 2. an earlier pass's approvals, as the pass made again parks -----------------------------------------------


@pytest.mark.slow
def test_the_approval_a_pass_made_again_left_behind_ends_unused_and_is_not_listed(
    writer, notes, django_capture_on_commit_callbacks, monkeypatch
) -> None:
    run, client = writer
    the_first_store_fails(monkeypatch)  # the scripted model names its calls anew (call_<random>) on each pass
    passes_made_twice(run)

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    stale, current = Approval.objects.filter(run=run).order_by("created_at")
    assert stale.call_id != current.call_id
    assert (stale.status, stale.reason) == ("expired", ASKED_AGAIN_APPROVAL)
    assert current.status == "pending"
    unused = AuditEvent.objects.get(run_id=run.id, action="approval.unused")
    assert unused.call_id == stale.call_id and unused.result == {
        "approval_id": str(stale.pk),
        "was": "pending",
        "why": "asked_again",
    }
    listed = client.get(f"/api/v1/runs/{run.id}").json()["approvals"]
    assert [a["id"] for a in listed if a["status"] == "pending"] == [str(current.id)]
    # Approving the stale one is refused (it was never going to be made), not answered "the run resumes".
    refused = decide(client, run, stale, "approve")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "approval_decided"
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, current, "approve").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert len(lines(notes)) == 1


@pytest.mark.slow
def test_a_decision_on_the_pass_made_again_taken_while_it_runs_queues_the_run(
    writer, notes, django_capture_on_commit_callbacks, monkeypatch
) -> None:
    # A reviewer quick on the list approves the second pass's approval before it parks: the first pass's, left
    # pending, no longer keeps the run parked until its time runs out.
    run, _client = writer

    def a_reviewer_approves_the_newest(claim):  # type: ignore[no-untyped-def]
        newest = Approval.objects.filter(run_id=claim.run_id).latest("created_at")
        approval_decide(
            run=Run.objects.get(pk=claim.run_id), approval_id=str(newest.pk), decision="approve", actor="admin:quick"
        )

    the_first_store_fails(monkeypatch, before_the_second=a_reviewer_approves_the_newest)
    with pytest.raises(OperationalError):
        execution.run_execute(run_id=str(run.id))
    with django_capture_on_commit_callbacks(execute=True):
        execution.run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.status, run.error_message)
    assert len(lines(notes)) == 1
    assert list(Approval.objects.filter(run=run).order_by("created_at").values_list("status", flat=True)) == [
        "expired",
        "executed",
    ]


@pytest.mark.slow
def test_an_earlier_passs_approval_approved_while_the_pass_made_again_runs_ends_unused_as_it_parks(
    writer, notes, monkeypatch
) -> None:
    run, _client = writer

    def a_reviewer_approves_the_oldest(claim):  # type: ignore[no-untyped-def]
        oldest = Approval.objects.filter(run_id=claim.run_id).earliest("created_at")
        approval_decide(
            run=Run.objects.get(pk=claim.run_id), approval_id=str(oldest.pk), decision="approve", actor="admin:late"
        )

    the_first_store_fails(monkeypatch, before_the_second=a_reviewer_approves_the_oldest)
    passes_made_twice(run)
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    stale, current = Approval.objects.filter(run=run).order_by("created_at")
    assert (stale.status, stale.reason, current.status) == ("expired", ASKED_AGAIN_APPROVAL, "pending")
    unused = AuditEvent.objects.get(run_id=run.id, action="approval.unused")
    assert unused.result == {"approval_id": str(stale.pk), "was": "approved", "why": "asked_again"}
    assert lines(notes) == []


# ---- 3. a decision's reason is never stored cut -------------------------------------------------------------------


@pytest.mark.slow
def test_the_admin_refuses_a_rejection_reason_over_the_limit_and_keeps_the_text(writer, notes) -> None:
    run, _client = writer
    approval = park(run)
    reviewer = get_user_model().objects.create_user("rev", "", "pw-Long-enough-7", is_staff=True)
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    browser = Client()
    browser.force_login(reviewer)
    url = f"/admin/agents/approval/{approval.pk}/decide/reject/"
    assert f'maxlength="{REASON_MAX_CHARS}"' in browser.get(url).content.decode()
    too_long = "거절" * 1001  # 2,002 characters
    response = browser.post(url, {"reason": too_long})
    page = response.content.decode()
    assert response.status_code == 200
    assert "Give a reason of at most 2000 characters (this one has 2002)." in page
    assert too_long in page  # kept in the form, to shorten
    approval.refresh_from_db()
    assert (approval.status, approval.reason) == ("pending", "")
    assert not AuditEvent.objects.filter(run_id=run.id, action="approval.reject").exists()
    # Line breaks count once, as the browser's maxlength counts them.
    exactly = "\r\n".join(["거절"] * 500)[: REASON_MAX_CHARS + 499]
    assert len(exactly.replace("\r\n", "\n")) <= REASON_MAX_CHARS
    assert browser.post(url, {"reason": exactly}).status_code == 302
    approval.refresh_from_db()
    assert approval.status == "rejected" and approval.reason == exactly.replace("\r\n", "\n").strip()


@pytest.mark.slow
def test_the_decision_service_refuses_a_reason_over_the_limit_and_audits_what_it_stores(writer, notes) -> None:
    run, _client = writer
    approval = park(run)
    with pytest.raises(ApplicationError) as refused:
        approval_decide(run=run, approval_id=str(approval.pk), decision="reject", actor="admin:x", reason="가" * 2001)
    assert (refused.value.status, refused.value.code) == (400, "invalid_input")
    approval.refresh_from_db()
    assert approval.status == "pending"
    reason = "가" * REASON_MAX_CHARS
    approval_decide(run=run, approval_id=str(approval.pk), decision="reject", actor="admin:x", reason=reason)
    approval.refresh_from_db()
    assert approval.reason == reason
    rejected = AuditEvent.objects.get(run_id=run.id, action="approval.reject")
    assert rejected.result == {"approval_id": str(approval.pk), "reason": approval.reason}
