"""Approvals, from a review:

1. an A2A text answer with a closing full stop ("승인합니다.", "승인!", "거절합니다。") decided nothing, and neither the
   ``input-required`` prompt nor the error named the words a text answer decides with;
2. an approval past its expiry, not yet swept, was titled "(pending)" on its page and its timeline step read
   "pending";
3. the decide page of an ended approval asked "Approve this call?" and hid why it ended;
4. rejecting a rule's or a flow's call said "the model is told why", where there is no model;
5. the approvals list showed when one expires last, the dashboard and the decide page not at all;
6. an approval's page read "Change approval", its History page a record's text.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from agents.api.a2a_server import DECISION_WORDS
from agents.decision_reasons import CANCELLED_APPROVAL
from agents.models import Agent, Approval, Run
from tests.agents import test_approvals, test_s40_a2a_mcp
from tests.agents.test_admin_runs import a_run, an_approval
from tests.agents.test_approvals import a_rule_that_saves_the_notes, lines, park
from tests.agents.test_s40_a2a_mcp import a2a, parked_with
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

# The approvals' fixtures: tasks run eagerly; an agent with the notes server, and the notes file. ``quiet``: an
# agent without servers, for A2A answers to a task parked as its worker parks it.
eager_tasks, writer, notes = test_approvals.eager_tasks, test_approvals.writer, test_approvals.notes
quiet = test_s40_a2a_mcp.quiet


def answered_with(caller: ApiCaller, agent: Agent, text: str) -> tuple[Any, Approval]:
    run = Run.objects.create(agent=agent, api_key=caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = parked_with(run, {"title": "회의록"})
    message = {"messageId": "m-1", "taskId": str(run.pk), "parts": [{"text": text}]}
    answer = a2a(caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})
    approval.refresh_from_db()
    return answer.json(), approval


def past_its_expiry() -> Approval:
    approval: Approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(minutes=5))
    approval.refresh_from_db()
    return approval


def english(client: Client, url: str) -> str:
    return client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()


# --- 1. a text answer with a closing full stop decides -------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("승인합니다.", Approval.Status.APPROVED),
        ("승인!", Approval.Status.APPROVED),
        ("승인합니다。", Approval.Status.APPROVED),
        ("승인~ ", Approval.Status.APPROVED),
        ("Approve.", Approval.Status.APPROVED),
        ("거절합니다.", Approval.Status.REJECTED),
        ("거절합니다…", Approval.Status.REJECTED),
        ("reject!!", Approval.Status.REJECTED),
    ],
)
def test_a_text_answer_with_a_closing_full_stop_decides(
    api_caller: ApiCaller, quiet: Agent, reply: str, status: str
) -> None:
    answer, approval = answered_with(api_caller, quiet, reply)
    assert "error" not in answer, answer
    assert approval.status == status


@pytest.mark.parametrize("reply", ["승인 안 함.", "승인?", "approve？"])
def test_a_text_that_only_contains_a_decision_word_still_decides_nothing_and_names_the_words(
    api_caller: ApiCaller, quiet: Agent, reply: str
) -> None:
    answer, approval = answered_with(api_caller, quiet, reply)
    assert answer["error"]["data"][0]["metadata"]["code"] == "decision_missing"
    assert approval.status == Approval.Status.PENDING
    assert all(word in answer["error"]["message"] for word in DECISION_WORDS)


def test_the_input_required_prompt_names_the_words_a_text_answer_decides_with(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    parked_with(run, {"title": "회의록"})
    task = a2a(api_caller, "GetTask", {"id": str(run.pk)}, **{"Accept-Language": "en"}).json()["result"]
    text = task["status"]["message"]["parts"][0]["text"]
    assert '"decision"' in text  # the data part, still
    assert all(word in text for word in DECISION_WORDS)


# --- 2. an approval past its expiry reads expired on its page and in its run's timeline ------------------------


def test_an_approval_past_its_expiry_is_titled_expired_and_its_timeline_step_reads_expired(
    admin_client: Client,
) -> None:
    approval = past_its_expiry()
    for url in (
        f"/admin/agents/approval/{approval.pk}/change/",
        f"/admin/agents/approval/{approval.pk}/decide/approve/",
    ):
        response = admin_client.get(url, HTTP_ACCEPT_LANGUAGE="en")
        page = response.content.decode()
        assert "(pending)" not in page, url
        steps = [step for step in response.context["timeline"] if step.kind == "approval"]
        assert [(s.status, s.status_text) for s in steps] == [("failed", "expired")], url
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/change/")
    assert "<h2>notes.append_note (expired)</h2>" in page
    assert re.search(r"<title>notes\.append_note \(expired\) \|", page)
    history = english(admin_client, f"/admin/agents/approval/{approval.pk}/history/")
    assert "(pending)" not in history and "notes.append_note (expired)" in history
    # The stored row is left for the periodic expiry.
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING


# --- 3. the decide page of an ended approval ----------------------------------------------------------------------


def test_the_decide_page_of_an_approval_ended_by_a_cancelled_run_says_why_and_asks_nothing(
    admin_client: Client,
) -> None:
    approval = an_approval(a_run(status=Run.Status.CANCELLED))
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.EXPIRED, reason=CANCELLED_APPROVAL)
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/decide/approve/")
    assert "Approve this call?" not in page and "already decided" not in page
    assert "the run was cancelled" in page and "Approval notes.append_note: expired" in page
    assert 'id="decide-form"' not in page


def test_the_decide_page_of_an_approval_past_its_expiry_says_it_has_expired(admin_client: Client) -> None:
    approval = past_its_expiry()
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/decide/reject/")
    assert "Reject this call?" not in page and "already decided" not in page
    assert "This approval has expired." in page


# --- 4. rejecting a rule's call names no model ---------------------------------------------------------------------


@pytest.mark.slow
def test_rejecting_a_rules_call_says_the_run_ends_and_its_caller_sees_it_not_that_the_model_is_told(
    writer,  # type: ignore[no-untyped-def]
    notes: Path,
    django_capture_on_commit_callbacks,  # type: ignore[no-untyped-def]
) -> None:
    run, _client = writer
    Agent.objects.filter(pk=run.agent_id).update(model_provider="offline")
    a_rule_that_saves_the_notes(run)
    approval = park(run)
    assert approval.call_id.startswith("rule:")
    browser = Client()
    browser.force_login(get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only"))
    url = f"/admin/agents/approval/{approval.pk}/decide/reject/"
    confirm = english(browser, url)
    assert "model is told" not in confirm and "caller sees the rejection" in confirm
    refused = browser.post(url, {"reason": " "}, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    error = re.search(r'<p class="errornote">(.*?)</p>', refused)
    assert error is not None and error.group(1) == "Give a reason for rejecting: the caller is told it."
    with django_capture_on_commit_callbacks(execute=True):
        response = browser.post(url, {"reason": "필요 없음"}, HTTP_ACCEPT_LANGUAGE="en", follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert said == ["Rejected: the call is not made; the run ends and its caller sees the rejection."]
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "deterministic:tool_failed")  # what its caller is told
    assert lines(notes) == []


def test_rejecting_the_models_call_still_says_the_model_is_told(admin_client: Client) -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/decide/reject/")
    assert "the model is told, with your reason" in page


# --- 5. when it expires, and who asked ----------------------------------------------------------------------------


def test_the_approvals_list_shows_when_one_expires_right_after_its_status(admin_client: Client) -> None:
    an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    page = english(admin_client, "/admin/agents/approval/")
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', page)
    assert columns[columns.index("status_badge") + 1] == "expires"


def test_the_dashboard_and_the_decide_page_show_who_asked_and_when_it_expires(admin_client: Client) -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    Approval.objects.filter(pk=approval.pk).update(requested_by="api:caller-7")
    row = re.search(r'<tr class="pending-approval".*?</tr>', english(admin_client, "/admin/"), re.S)
    assert row is not None
    assert "requested by: api:caller-7" in row.group(0) and "expires in 59" in row.group(0)
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/decide/approve/")
    assert "Asked by api:caller-7 at " in page and "; expires at " in page


# --- 6. an approval is viewed, and has its own history text ------------------------------------------------------


def test_an_approvals_page_is_titled_view_approval(admin_client: Client) -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/change/")
    assert "<h1>View approval</h1>" in page and "Change approval" not in page


def test_an_approvals_history_page_says_its_status_changes_and_links_its_runs_audit_events(
    admin_client: Client,
) -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    page = english(admin_client, f"/admin/agents/approval/{approval.pk}/history/")
    assert "pending → approved → executing → executed" in page
    assert "never changed once written" not in page
    assert f'href="/admin/audit/auditevent/?run={approval.run_id}" id="approval-audit-events"' in page


def test_the_approvals_list_is_titled_to_view(admin_client: Any) -> None:
    """Nobody edits an approval: its list read "Select approval to change" for whoever may decide."""
    page = admin_client.get("/admin/agents/approval/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Select approval to view" in page and "Select approval to change" not in page
