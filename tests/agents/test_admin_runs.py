"""The admin's run and approval pages: a run reads as a timeline (raw data collapsed below it), follows the run
live through a session-authorised event stream, and can be cancelled; approvals are listed pending first with
their arguments and decided on their own page; nothing here is deleted, and a read-only user's write is a 403."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.models import Agent, Approval, Run, RunEvent
from audit.services import audit_event_record
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def a_run(*, status: str = Run.Status.SUCCEEDED, **fields) -> Run:  # type: ignore[no-untyped-def]
    agent = Agent.objects.filter(slug="ledger").first() or Agent.objects.create(slug="ledger", name="장부")
    return Run.objects.create(agent=agent, query="장부를 보여줘", status=status, **fields)


def an_approval(run: Run, *, status: str = Approval.Status.PENDING, minutes_ago: int = 0, tool: str = "append_note"):  # type: ignore[no-untyped-def]
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool=tool,
        args={"text": "회의록 저장", "token": "****"},
        call_hash=f"{tool}{minutes_ago}".ljust(64, "0"),
        call_id=f"call-{tool}-{minutes_ago}",
        status=status,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    Approval.objects.filter(pk=approval.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    return approval


def test_a_runs_page_shows_the_timeline_before_the_raw_data_which_is_collapsed(admin_client) -> None:
    run = a_run(
        answer="장부 요약",
        messages=[
            {"type": "rule", "rule": "장부 조회", "mcp_id": "ledger", "tool": "lookup", "matched": True, "params": {"q": "x"}},
            {"type": "deterministic_call", "rule_id": 1, "mcp_id": "ledger", "tool": "lookup", "args": {"q": "x"},
             "ok": False, "error": "timeout", "message": "took too long"},
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "args": {"q": "y"}}]},
            {"type": "tool", "content": "결과", "tool_call_id": "c1", "name": "lookup", "status": "success"},
        ],
        timings={"total_ms": 42.5},
    )  # fmt: skip
    for attempt, ok, reason in ((1, False, "timeout"), (2, True, "")):
        audit_event_record(
            source="agent", run_id=run.pk, mcp_id="ledger", tool="lookup", call_id="c1", args={"q": "y"},
            ok=ok, reason=reason, attempt=attempt, latency_ms=10.0, actor="local",
        )  # fmt: skip
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert page.index('id="run-timeline"') < page.index("Raw data")
    assert 'class="module collapse' in page or "<details" in page[page.index("Raw data") - 400 :]
    assert "status-failed" in page  # the deterministic call that failed
    assert "status-degraded" in page  # the model's call that worked on its second attempt
    assert "2 attempt(s)" in page and ">20.0 ms<" in page  # the time once, as the step's duration
    assert "42.5 ms in all" in page
    assert f"/admin/audit/auditevent/?run={run.pk}" in page
    assert "/delete/" not in page and 'name="_save"' not in page
    assert 'data-events-url="/admin/agents/run/' in page
    assert "Cancel run" not in page  # finished


def test_no_one_deletes_a_run_or_an_approval(admin_client) -> None:
    run = a_run()
    approval = an_approval(run)
    for url in (f"/admin/agents/run/{run.pk}/delete/", f"/admin/agents/approval/{approval.pk}/delete/"):
        assert admin_client.get(url).status_code == 403
        assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert (
        admin_client.post(
            "/admin/agents/run/", {"action": "delete_selected", "_selected_action": [str(run.pk)]}
        ).status_code
        == 403
    )
    assert Run.objects.filter(pk=run.pk).exists() and Approval.objects.filter(pk=approval.pk).exists()


def test_an_admin_cancels_a_running_run_and_an_auditor_cannot(admin_client, auditor_client) -> None:
    run = a_run(status=Run.Status.RUNNING)
    assert "Cancel run" in admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert "Cancel run" not in auditor_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert auditor_client.post(f"/admin/agents/run/{run.pk}/cancel/").status_code == 403
    # A GET changes nothing: a copied address leads to the run's page (it said "not allowed" to an admin).
    assert admin_client.get(f"/admin/agents/run/{run.pk}/cancel/")["Location"] == f"/admin/agents/run/{run.pk}/change/"
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    response = admin_client.post(f"/admin/agents/run/{run.pk}/cancel/", follow=True)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.error_message == "cancelled by admin:admin"
    assert "The run was cancelled." in response.content.decode()
    again = admin_client.post(f"/admin/agents/run/{run.pk}/cancel/", follow=True).content.decode()
    assert "already finished" in again


def test_the_live_stream_replays_a_runs_events_to_the_admin_session_and_ends(admin_client, auditor_client) -> None:
    run = a_run(answer="끝")
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running"})
    RunEvent.objects.create(run=run, seq=2, kind="status", data={"status": "succeeded", "answer": "끝"})
    for client in (admin_client, auditor_client):
        response = client.get(f"/admin/agents/run/{run.pk}/events/")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
        body = b"".join(response.streaming_content).decode()
        assert body.index("id: 1\nevent: status") < body.index("id: 2\nevent: status") < body.index("event: end")
        assert '"answer":"끝"' in body
    tail = b"".join(admin_client.get(f"/admin/agents/run/{run.pk}/events/?after=1").streaming_content).decode()
    assert "id: 1\n" not in tail and "id: 2\n" in tail
    resumed = admin_client.get(f"/admin/agents/run/{run.pk}/events/", HTTP_LAST_EVENT_ID="1").streaming_content
    assert "id: 1\n" not in b"".join(resumed).decode()


def test_the_live_stream_and_timeline_need_a_staff_session_that_may_view_runs(client, outsider_client) -> None:
    run = a_run()
    for url in (f"/admin/agents/run/{run.pk}/events/", f"/admin/agents/run/{run.pk}/timeline/"):
        assert client.get(url).status_code == 302  # to the admin's login
        assert outsider_client.get(url).status_code == 403


def test_the_timeline_fragment_is_what_the_live_page_swaps_in(admin_client) -> None:
    run = a_run(status=Run.Status.RUNNING, messages=[{"type": "human", "content": "장부를 보여줘"}])
    fragment = admin_client.get(f"/admin/agents/run/{run.pk}/timeline/").content.decode()
    assert fragment.lstrip().startswith('<div id="run-live"') and 'data-finished="false"' in fragment
    assert "user query" in fragment and "Cancel run" in fragment


def test_approvals_are_listed_pending_first_oldest_first_with_their_masked_arguments(admin_client) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    decided = an_approval(run, status=Approval.Status.REJECTED, minutes_ago=1, tool="decided")
    newer = an_approval(run, minutes_ago=5, tool="newer")
    older = an_approval(run, minutes_ago=50, tool="older")
    response = admin_client.get("/admin/agents/approval/")
    assert [a.pk for a in response.context["cl"].result_list] == [older.pk, newer.pk, decided.pk]
    page = response.content.decode()
    assert "회의록 저장" in page and "****" in page
    assert 'name="action"' not in page  # decisions are taken one at a time, on the approval's page


def test_an_auditor_sees_an_approval_and_its_arguments_but_every_decision_attempt_is_a_403(auditor_client) -> None:
    approval = an_approval(a_run(status=Run.Status.AWAITING_APPROVAL))
    page = auditor_client.get(f"/admin/agents/approval/{approval.pk}/change/").content.decode()
    assert "회의록 저장" in page and "approve-button" not in page
    for response in (
        auditor_client.post("/admin/agents/approval/", {"action": "approve", "_selected_action": [str(approval.pk)]}),
        auditor_client.get(f"/admin/agents/approval/{approval.pk}/decide/approve/"),
        auditor_client.post(f"/admin/agents/approval/{approval.pk}/decide/approve/", {"reason": ""}),
        auditor_client.post(f"/admin/agents/approval/{approval.pk}/decide/reject/", {"reason": "싫음"}),
        auditor_client.post(f"/admin/agents/approval/{approval.pk}/change/", {}),
    ):
        assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_an_approvals_page_shows_the_call_its_arguments_the_buttons_and_the_runs_trace(admin_client) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL, messages=[{"type": "human", "content": "회의록을 저장해줘"}])
    approval = an_approval(run)
    page = admin_client.get(f"/admin/agents/approval/{approval.pk}/change/").content.decode()
    assert page.index("notes.append_note") < page.index("회의록 저장") < page.index('id="approve-button"')
    assert 'id="reject-button"' in page and "user query" in page
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    reject = admin_client.get(f"/admin/agents/approval/{approval.pk}/decide/reject/").content.decode()
    assert "Reason (required)" in reject and "required" in reject and "회의록 저장" in reject


def test_an_approvals_arguments_are_a_row_each_with_values_as_the_rule_editor_writes_them(admin_client) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL)
    approval = an_approval(run)
    Approval.objects.filter(pk=approval.pk).update(
        args={"text": "회의록 저장", "count": 5, "code": "5", "tags": ["a", "b"], "token": "****"}
    )
    for url in (
        f"/admin/agents/approval/{approval.pk}/change/",
        f"/admin/agents/approval/{approval.pk}/decide/approve/",
    ):
        page = admin_client.get(url).content.decode()
        table = re.search(r'<table class="approval-args approval-arg-rows".*?</table>', page, re.S)
        assert table is not None, url
        rows = re.findall(r"<tr><th><code>(.*?)</code></th><td>(.*?)</td></tr>", table.group(0))
        assert rows == [
            ("text", "회의록 저장"),
            ("count", "5"),
            ("code", "&quot;5&quot;"),  # text that would read as a number is quoted
            ("tags", "[&quot;a&quot;, &quot;b&quot;]"),
            ("token", "****"),
        ]
    Approval.objects.filter(pk=approval.pk).update(args={})
    page = admin_client.get(f"/admin/agents/approval/{approval.pk}/change/").content.decode()
    assert "No arguments." in page


def test_a_real_runs_timeline_marks_the_model_steps_and_the_answer(demo_server, admin_client) -> None:
    from agents.execution import run_execute

    agent = make_agent(
        slug="react",
        servers=[demo_server],
        provider="scripted",
        script=[
            {"tool_calls": [{"name": "list_team_members", "args": {"team": "클라우드운영팀"}}]},
            {"content": "팀원 목록: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="김하늘 님은 어느 팀 소속인가요?")
    run_execute(run_id=str(run.id))
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    labels = ["rule decision", "deterministic call", "model turn 1", "tool call", "answer"]
    positions = [page.index(f">{label}<") for label in labels]
    assert positions == sorted(positions)
    assert "step-answer status-ok" in page


@pytest.mark.parametrize("language", ["ko", "en"])
def test_the_runs_list_writes_dates_as_the_run_page_and_the_audit_do(admin_client, language: str) -> None:  # type: ignore[no-untyped-def]
    from django.utils.timezone import localtime

    run = a_run()
    page = admin_client.get("/admin/agents/run/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
    local = localtime(run.created_at)  # the date above the time, each kept whole
    assert f'{local:%Y-%m-%d}</span><br><span class="cell-nowrap">{local:%H:%M:%S} KST' in page
    assert "오전" not in page and "a.m." not in page


@pytest.mark.slow
def test_a_runs_arguments_are_a_row_each_and_a_followed_fallback_reads_as_such(admin_client) -> None:
    """The rule's parameters, the deterministic call's and the model's tool call's arguments a row each, as an
    approval's; an offline run that followed the contract's fallback shows the failed call and the backup."""
    from agents.execution import run_execute
    from tests.conftest import bind_demo_server

    server = bind_demo_server(mcp_id="broken", failure_mode="bad_schema")
    agent = make_agent(slug="offline-recovers", servers=[server])
    run = Run.objects.create(agent=agent, query="A-1001 자산의 현재 상태를 알려주세요.")
    run_execute(run_id=str(run.id))
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert page.count('<table class="step-args"><tr><th><code>asset_id</code></th><td>A-1001</td></tr></table>') == 2
    step = page[page.index(">deterministic call<") :]
    step = step[: step.index("</li>")]
    assert (
        "broken.get_asset_status_backup" in step and "from the fallback tool, because get_asset_status failed" in step
    )
    assert "<code>get_asset_status</code>: answer of the wrong shape <code>result:shape</code>" in step
    assert "<code>get_asset_status_backup</code>: ok" in step and "백업 스냅샷 기준" in step
    assert 'class="step step-deterministic status-degraded"' in page


@pytest.mark.parametrize(
    ("language", "words"),
    [("en", "every deterministic call failed (deterministic:tool_failed)"), ("ko", "확정 호출이 모두 실패함")],
)
def test_a_failed_runs_error_step_says_in_words_how_it_ended(admin_client, language: str, words: str) -> None:
    run = a_run(
        status=Run.Status.FAILED,
        error_code="deterministic:tool_failed",
        error_message="결정론적 도구 호출이 실패했습니다.",
        messages=[{"type": "outcome", "reason": "deterministic:tool_failed", "tool_errors": ["tool:error"]}],
    )
    admin_client.cookies["django_language"] = language
    page = html.unescape(admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode())
    assert page.count(words) == 2 and "deterministic:tool_failed" in page  # the outcome step, the error step
    assert (
        "the tool reported an error (tool:error)" if language == "en" else "도구가 오류를 보고함 (tool:error)"
    ) in page
