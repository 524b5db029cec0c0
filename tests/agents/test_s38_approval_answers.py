"""A write a person declined reads as not carried out even beside a failed read; an approval past its expiry that
the periodic expiry has not reached yet reads as expired in the admin list and the API; an approval's expiry is
written the same on every surface."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from agents.answers import all_calls_failed_text
from agents.api.a2a_server import pending_approvals
from agents.api.mcp_server import call_result
from agents.approvals import approvals_waiting
from agents.models import Agent, Approval, DeterministicRule, RunEvent
from tests.agents.test_approvals import (  # noqa: F401
    a_rule_that_saves_the_notes,
    decide,
    eager_tasks,
    lines,
    notes,
    park,
    writer,
)

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.mark.parametrize(
    ("codes", "declined"),
    [
        (["approval:rejected", "timeout"], "This request was not carried out: its approval was rejected."),
        (["tool:error", "approval:expired"], "This request was not carried out: it was not approved in time."),
        (["args:type:chars", "approval:rejected"], "This request was not carried out: its approval was rejected."),
        (["approval:rejected", "approval:expired"], "This request was not carried out: it was not approved."),
    ],
)
def test_a_declined_write_beside_a_failed_read_reads_as_not_carried_out_not_to_try_again(codes, declined) -> None:
    text = all_calls_failed_text(language="en", codes=codes)
    assert text.startswith(declined)
    assert "try again" not in text.lower()
    assert "다시 시도" not in all_calls_failed_text(language="ko", codes=codes)


def test_a_rejected_and_an_expired_write_are_not_told_not_approved_in_time() -> None:
    text = all_calls_failed_text(language="en", codes=["approval:rejected", "approval:expired"])
    assert text == "This request was not carried out: it was not approved."
    assert "제시간에" not in all_calls_failed_text(language="ko", codes=["approval:rejected", "approval:expired"])


@pytest.mark.slow
def test_an_offline_run_whose_rule_write_was_rejected_and_whose_read_failed_says_the_write_was_not_carried_out(
    writer,  # noqa: F811 - the fixture
    notes,  # noqa: F811 - the fixture
    django_capture_on_commit_callbacks,
) -> None:
    run, client = writer
    Agent.objects.filter(pk=run.agent_id).update(model_provider="offline", language="ko")
    a_rule_that_saves_the_notes(run)
    DeterministicRule.objects.create(
        agent=run.agent,
        name="읽기 규칙",
        server=run.agent.servers.get(),
        tool_name="big_text",
        when={"any_keywords": ["회의록"]},
        params={"chars": "많이"},  # not the integer the tool takes: this read fails
    )
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200

    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "deterministic:tool_failed")
    assert {r.get("error") for r in run.deterministic_results} == {"approval:rejected", "args:type:chars"}
    assert run.error_message.startswith("요청을 수행하지 않았습니다: 승인이 거부되었습니다.")
    assert "다시 시도" not in run.error_message
    assert lines(notes) == []


@pytest.mark.slow
def test_an_approval_past_its_expiry_not_yet_swept_reads_expired_in_the_admin_list_and_the_api(
    writer,  # noqa: F811 - the fixture
) -> None:
    run, client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(minutes=5))

    body = client.get(f"/api/v1/runs/{run.id}").json()
    assert [a["status"] for a in body["approvals"]] == ["expired"]

    boss = get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only")
    browser = Client()
    browser.force_login(boss)
    page = browser.get("/admin/agents/approval/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    row = re.search(r"<tr.*?approval-status-(\w+)\">([^<]*)</span>.*?</tr>", page, re.S)
    assert row is not None and row.groups() == ("expired", Approval.Status.EXPIRED.label)
    expires = re.search(r"field-expires[^>]*>(.*?)</td>", page, re.S)
    assert expires is not None and expires.group(1).strip() == "—"
    change_url = f"/admin/agents/approval/{approval.pk}/change/"
    assert change_url not in browser.get("/admin/agents/approval/?status__exact=pending").content.decode()
    assert change_url in browser.get("/admin/agents/approval/?status__exact=expired").content.decode()

    # Nor is it offered as waiting anywhere else: A2A's and MCP's pending lists, the run page's bar, run_query.
    run.refresh_from_db()
    assert pending_approvals(run) == []
    assert call_result(run)["structuredContent"]["approvals_pending"] == []
    run_page = browser.get(f"/admin/agents/run/{run.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert 'class="run-pending"' not in run_page  # "Waiting for a decision:" names none
    assert list(approvals_waiting(run)) == []


@pytest.mark.slow
def test_a_pending_approval_is_still_pending_in_the_list_its_filter_and_the_api(
    writer,  # noqa: F811 - the fixture
) -> None:
    run, client = writer
    approval = park(run)
    assert [a["status"] for a in client.get(f"/api/v1/runs/{run.id}").json()["approvals"]] == ["pending"]
    run.refresh_from_db()
    assert [a["approvalId"] for a in pending_approvals(run)] == [str(approval.pk)]
    assert [a["approval_id"] for a in call_result(run)["structuredContent"]["approvals_pending"]] == [str(approval.pk)]
    boss = get_user_model().objects.create_superuser("boss", "", "pw-for-tests-only")
    browser = Client()
    browser.force_login(boss)
    page = browser.get("/admin/agents/approval/?status__exact=pending").content.decode()
    assert f"/admin/agents/approval/{approval.pk}/change/" in page
    assert "approval-status-pending" in page
    assert (
        f"/admin/agents/approval/{approval.pk}/change/"
        not in browser.get("/admin/agents/approval/?status__exact=expired").content.decode()
    )


@pytest.mark.slow
def test_an_approvals_expiry_is_written_the_same_in_its_event_the_api_and_mcp(
    writer,  # noqa: F811 - the fixture
) -> None:
    run, client = writer
    park(run)
    [event] = [
        data for kind, data in RunEvent.objects.filter(run=run).values_list("kind", "data") if kind == "approval"
    ]
    [shown] = client.get(f"/api/v1/runs/{run.id}").json()["approvals"]
    run.refresh_from_db()
    [waiting] = call_result(run)["structuredContent"]["approvals_pending"]
    assert event["expires_at"] == shown["expires_at"] == waiting["expires_at"]
