"""The auditor's workspace in the admin: the audit list newest first with timestamps to the second and the time
zone, the short run id as a filter (also in the API and so in exports), Verify chain (what ``verify_audit``
says), metrics over time as server-drawn charts, and every write attempt a 403 (admin and API)."""

from __future__ import annotations

import base64
import io
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from agents.models import Agent, Run
from audit.append_only import sqlite_triggers_lift
from audit.models import AuditEvent
from audit.services import audit_event_record
from auditor.metrics import bucket_starts, tool_metrics_series
from tests.conftest import AUDITOR_PASSWORD

pytestmark = pytest.mark.django_db


def two_runs_with_events() -> tuple[Run, Run]:
    agent = Agent.objects.create(slug="ledger", name="장부")
    first = Run.objects.create(agent=agent, query="a", id=uuid.UUID("8c2f1a9b-0000-4000-8000-000000000001"))
    second = Run.objects.create(agent=agent, query="b", id=uuid.UUID("8c2f1a9c-0000-4000-8000-000000000002"))
    for run in (first, second):
        audit_event_record(
            source="agent", run_id=run.pk, mcp_id="m", tool="t", ok=True, attempt=1, latency_ms=3, actor="local"
        )
    return first, second


def test_the_audit_list_is_newest_first_with_seconds_and_the_time_zone(auditor_client) -> None:
    two_runs_with_events()
    response = auditor_client.get("/admin/audit/auditevent/")
    ids = [e.pk for e in response.context["cl"].result_list]
    assert ids == sorted(ids, reverse=True)
    newest = AuditEvent.objects.get(pk=ids[0])
    local = timezone.localtime(newest.created_at)
    page = response.content.decode()  # the date above the time, each kept whole
    assert f'{local:%Y-%m-%d}</span><br><span class="cell-nowrap">{local:%H:%M:%S} KST' in page


def test_the_short_run_id_the_list_shows_is_a_filter_and_the_export_keeps_it(auditor_client) -> None:
    first, second = two_runs_with_events()
    page = auditor_client.get("/admin/audit/auditevent/").content.decode()
    assert ">8c2f1a9b<" in page
    response = auditor_client.get("/admin/audit/auditevent/?run=8c2f1a9b")
    assert [e.run_id for e in response.context["cl"].result_list] == [first.pk]
    assert "/api/v1/audit/events?run=8c2f1a9b&amp;format=csv" in response.content.decode()
    assert [e.run_id for e in auditor_client.get("/admin/audit/auditevent/?run=8c2f1a9").context["cl"].result_list] == [
        second.pk,
        first.pk,
    ]
    exported = auditor_client.get("/api/v1/audit/events?run=8c2f1a9b&format=jsonl")
    body = b"".join(exported.streaming_content).decode()
    assert str(first.pk) in body and str(second.pk) not in body
    assert auditor_client.get("/api/v1/audit/events?run=8c2").status_code == 400  # too short to mean one run
    assert auditor_client.get(f"/api/v1/audit/events?run={second.pk}").json()["results"][0]["run"] == str(second.pk)


def test_verify_chain_shows_what_verify_audit_says(auditor_client) -> None:
    two_runs_with_events()
    assert 'id="verify-chain-button"' in auditor_client.get("/admin/audit/auditevent/").content.decode()
    said = io.StringIO()
    call_command("verify_audit", stdout=said)
    page = auditor_client.post("/admin/audit/auditevent/verify/").content.decode()
    assert "The audit chain is intact." in page and said.getvalue().strip() in page
    sqlite_triggers_lift(connection)  # as an intruder with the database file would (tests/audit/test_chain.py)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE audit_auditevent SET tool = 'forged' WHERE seq = 2")
    with pytest.raises(CommandError) as broken:
        call_command("verify_audit")
    page = auditor_client.post("/admin/audit/auditevent/verify/").content.decode()
    assert "The audit chain was altered." in page
    assert str(broken.value).split(":")[0] in page


def test_verify_chain_speaks_the_auditors_language(auditor_client) -> None:
    two_runs_with_events()
    page = auditor_client.post("/admin/audit/auditevent/verify/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "건 검증, 헤드 " in page and "verified " not in page


def test_verify_chain_is_for_those_who_may_read_the_audit(outsider_client) -> None:
    assert outsider_client.post("/admin/audit/auditevent/verify/").status_code == 403


def test_metrics_show_calls_error_rate_and_p95_over_time_as_svg(auditor_client) -> None:
    for ok, latency in ((True, 10.0), (False, 30.0), (True, 20.0)):
        audit_event_record(
            source="agent",
            mcp_id="m",
            tool="t",
            ok=ok,
            reason="" if ok else "timeout",
            attempt=1,
            latency_ms=latency,
            actor="local",
        )
    page = auditor_client.get("/admin/audit/auditevent/metrics/?bucket=hour").content.decode()
    assert 'id="metrics-over-time"' in page
    assert page.count("<svg") >= 6  # all tools, and m.t: calls, error rate, p95 each
    assert "33.3%</title>" in page  # one call in three failed, this hour
    assert "<script" not in page.split('id="metrics-over-time"')[1].split("</table>")[0]
    [total, tool] = tool_metrics_series(bucket="day")
    assert (total.calls, tool.tool, tool.calls) == (3, "t", 3)
    assert tool.points[-1].errors == 1 and tool.points[-1].latency_p95_ms == 29.0


def test_buckets_are_local_hours_and_days() -> None:
    since = timezone.now() - timedelta(hours=5)
    starts = bucket_starts(since=since, until=timezone.now(), bucket="hour")
    assert len(starts) in (5, 6) and all(s.minute == 0 and s.second == 0 for s in starts)
    days = bucket_starts(since=timezone.now() - timedelta(days=3), until=timezone.now(), bucket="day")
    assert len(days) == 4 and all(timezone.localtime(d).hour == 0 for d in days)


def test_every_write_attempt_by_an_auditor_is_a_403_in_the_admin(auditor_client) -> None:
    two_runs_with_events()
    event = AuditEvent.objects.filter(run_id__isnull=False).first()
    assert event is not None
    for url, data in (
        ("/admin/audit/auditevent/", {"action": "delete_selected", "_selected_action": [str(event.pk)]}),
        (f"/admin/audit/auditevent/{event.pk}/change/", {"tool": "x"}),
        (f"/admin/audit/auditevent/{event.pk}/delete/", {"post": "yes"}),
        ("/admin/audit/auditevent/add/", {}),
        ("/admin/agents/run/", {"action": "delete_selected", "_selected_action": [str(event.run_id)]}),
        (f"/admin/agents/run/{event.run_id}/cancel/", {}),
    ):
        assert auditor_client.post(url, data).status_code == 403, url
    assert AuditEvent.objects.filter(pk=event.pk, tool="t").exists()


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_every_write_attempt_by_an_auditor_is_a_403_in_the_api(auditor_user, auditor_client, method) -> None:
    two_runs_with_events()
    before = AuditEvent.objects.count()
    basic = "Basic " + base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()
    for url in ("/api/v1/audit/events", "/api/v1/audit/metrics"):
        assert getattr(Client(), method)(url, {}, HTTP_AUTHORIZATION=basic).status_code == 403, url
        assert getattr(auditor_client, method)(url, {}).status_code == 403, url
    assert AuditEvent.objects.count() == before


@pytest.mark.django_db
def test_an_events_name_says_what_happened_and_to_which_tool() -> None:
    """Its page's title and breadcrumb: a tool call names its server and tool; a change of configuration names
    no tool, and no stray dot ("#1 admin ." before)."""
    from audit.models import AuditEvent
    from audit.services import audit_event_record

    call = audit_event_record(source="agent", mcp_id="local", tool="calculate", ok=True)
    change = audit_event_record(source="admin", action="config.agent.create", actor="admin:admin")
    assert str(AuditEvent.objects.get(pk=call.pk)) == f"#{call.pk} tool.call · local.calculate"
    assert str(AuditEvent.objects.get(pk=change.pk)) == f"#{change.pk} config.agent.create"
