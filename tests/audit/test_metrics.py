"""Tool metrics (seed 002, section 9): calls, error rate and errors by reason, p50/p95 latency, calls per run and
per caller, over a period. Figures are checked against a known set of events."""

from __future__ import annotations

import datetime as dt
import random
import statistics

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import include, path
from django.utils import timezone
from rest_framework.test import APIClient

from agents.models import Agent, ApiKey, Run
from audit.models import AuditEvent
from auditor.metrics import tool_metrics

pytestmark = pytest.mark.django_db

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/audit/", include("auditor.urls")),
    path("api/v1/", include("agents.api.urls")),
]

NOW = timezone.now()


@pytest.fixture(autouse=True)
def audit_api_urls(settings):  # type: ignore[no-untyped-def]
    settings.ROOT_URLCONF = __name__


_seq = iter(range(10**12, 10**13))


def event(**fields) -> AuditEvent:  # type: ignore[no-untyped-def]
    """One tool call as the gate records it. Written with ``bulk_create`` so that its time can be set; it
    bypasses the hash chain (seq numbers far past the chain head)."""
    values = {
        "source": "agent",
        "action": "tool.call",
        "ok": True,
        "attempt": 1,
        "created_at": NOW - dt.timedelta(hours=1),
    }
    values.update(fields)
    return AuditEvent(**values, seq=next(_seq), prev_hash="0" * 64, hash="0" * 64)


@pytest.fixture
def known_events(db):  # type: ignore[no-untyped-def]
    """search_employee: 6 sent attempts (10..50 ms ok, one 100 ms timeout), a refused call and a memo hit, over
    two runs of the caller 'caller'; get_asset: 2 calls by 'local'; plus events that are not tool calls and an
    old one outside the default period."""
    agent = Agent.objects.create(slug="hr", name="인사")
    key = ApiKey.objects.create(name="caller", prefix="apk_caller01", digest="0" * 64)
    first = Run.objects.create(agent=agent, api_key=key, query="q1")
    second = Run.objects.create(agent=agent, api_key=key, query="q2")
    third = Run.objects.create(agent=agent, query="q3")
    caller = "api_key:apk_caller01"
    search = {"mcp_id": "company", "tool": "search_employee", "actor": caller}
    AuditEvent.objects.bulk_create(
        [
            event(**search, run_id=first.id, latency_ms=10.0),
            event(**search, run_id=first.id, latency_ms=20.0),
            event(**search, run_id=first.id, latency_ms=30.0),
            event(**search, run_id=second.id, latency_ms=40.0),
            event(**search, run_id=second.id, latency_ms=50.0),
            event(**search, run_id=second.id, latency_ms=100.0, ok=False, reason="timeout"),
            event(**search, run_id=second.id, latency_ms=None, attempt=0, ok=False, reason="args:missing:name"),
            event(**search, run_id=first.id, latency_ms=0.0, attempt=0, reason="memo:hit"),
            event(mcp_id="company", tool="get_asset", actor="local", run_id=third.id, latency_ms=5.0),
            event(mcp_id="company", tool="get_asset", actor="local", run_id=third.id, latency_ms=7.0, attempt=2),
            # not tool calls: never counted
            event(mcp_id="company", tool="search_employee", action="rule.decision", attempt=0, reason="rule:matched"),
            event(source="admin", action="mcp_server.update", mcp_id="company", actor="boss"),
            # outside the default 7 days
            event(**search, latency_ms=999.0, created_at=NOW - dt.timedelta(days=8)),
        ]
    )


def by_tool(report, tool: str):  # type: ignore[no-untyped-def]
    [found] = [t for t in report.tools if t.tool == tool]
    return found


def test_calls_errors_and_error_rate_per_tool(known_events) -> None:
    report = tool_metrics(until=NOW)
    search = by_tool(report, "search_employee")
    assert (search.calls, search.errors) == (8, 2)
    assert search.error_rate == 0.25
    assert search.errors_by_reason == {"timeout": 1, "args:missing:name": 1}
    asset = by_tool(report, "get_asset")
    assert (asset.calls, asset.errors, asset.error_rate, asset.retries) == (2, 0, 0.0, 1)
    assert (report.calls, report.errors, report.error_rate) == (10, 2, 0.2)
    assert [t.tool for t in report.tools] == ["search_employee", "get_asset"]  # most called first


def test_latency_percentiles_are_over_attempts_sent_to_the_server(known_events) -> None:
    search = by_tool(tool_metrics(until=NOW), "search_employee")
    # sorted latencies 10 20 30 40 50 100 (the refusal and the memo hit were never sent)
    assert search.latency_p50_ms == 35.0  # between 30 and 40
    assert search.latency_p95_ms == 87.5  # 50 + 0.75 × 50
    assert search.latency_mean_ms == 41.67
    asset = by_tool(tool_metrics(until=NOW), "get_asset")
    assert (asset.latency_p50_ms, asset.latency_p95_ms) == (6.0, 6.9)


def test_calls_per_run_and_per_caller(known_events) -> None:
    report = tool_metrics(until=NOW)
    search = by_tool(report, "search_employee")
    assert (search.runs, search.calls_per_run) == (2, 4.0)
    assert search.callers == {"api_key:apk_caller01": 8}
    assert by_tool(report, "get_asset").callers == {"local": 2}
    assert (report.runs, report.calls_per_run) == (3, round(10 / 3, 4))
    callers = {c.actor: c for c in report.callers}
    assert (callers["api_key:apk_caller01"].name, callers["api_key:apk_caller01"].calls) == ("caller", 8)
    assert (callers["local"].runs, callers["local"].calls_per_run, callers["local"].errors) == (1, 2.0, 0)


def test_the_period_defaults_to_the_last_seven_days_and_can_be_chosen(known_events) -> None:
    assert by_tool(tool_metrics(until=NOW), "search_employee").calls == 8
    wider = tool_metrics(since=NOW - dt.timedelta(days=9), until=NOW)
    assert by_tool(wider, "search_employee").calls == 9
    assert by_tool(wider, "search_employee").latency_p95_ms > 100
    assert tool_metrics(since=NOW - dt.timedelta(days=9), until=NOW - dt.timedelta(days=2)).calls == 1
    assert tool_metrics(since=NOW, until=NOW + dt.timedelta(hours=1)).tools == []


def test_percentiles_match_statistics_quantiles_on_a_larger_sample(db) -> None:
    rng = random.Random(7)
    latencies = [round(rng.lognormvariate(3, 0.8), 3) for _ in range(1001)]
    AuditEvent.objects.bulk_create([event(mcp_id="s", tool="t", latency_ms=v) for v in latencies])
    [tool] = tool_metrics(until=NOW).tools
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    assert tool.latency_p50_ms == round(statistics.median(latencies), 2)
    assert tool.latency_p95_ms == round(quantiles[94], 2)


def test_the_metrics_api_gives_the_same_figures_and_takes_a_period(auditor_client, known_events) -> None:
    response = auditor_client.get("/api/v1/audit/metrics", {"until": (NOW + dt.timedelta(minutes=1)).isoformat()})
    assert response.status_code == 200
    body = response.json()
    [search] = [t for t in body["tools"] if t["tool"] == "search_employee"]
    assert (search["calls"], search["error_rate"], search["latency_p95_ms"]) == (8, 0.25, 87.5)
    assert search["errors_by_reason"] == {"timeout": 1, "args:missing:name": 1}
    since = (NOW - dt.timedelta(days=9)).date().isoformat()
    wider = auditor_client.get("/api/v1/audit/metrics", {"since": since}).json()
    assert wider["calls"] == 11
    only_asset = auditor_client.get("/api/v1/audit/metrics", {"tool": "get_asset"}).json()
    assert [t["tool"] for t in only_asset["tools"]] == ["get_asset"]


def test_the_metrics_api_is_for_auditors_only(known_events, api_client) -> None:
    assert api_client.get("/api/v1/audit/metrics").status_code == 403
    assert APIClient().get("/api/v1/audit/metrics").status_code == 401


def test_the_admin_metrics_page_shows_the_figures_with_bars(auditor_client, known_events) -> None:
    response = auditor_client.get("/admin/audit/auditevent/metrics/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Tool metrics" in page and "search_employee" in page and "get_asset" in page
    assert "87.5" in page and "35.0" in page and "25.0%" in page
    assert "args:missing:name" in page and "api_key:apk_caller01" in page
    assert 'class="bar bar-calls" style="width: 100%"' in page
    assert "<b>3.33</b>" in page and "3.3333" not in page  # 10 calls in 3 runs, as people read it
    content = page.split('id="content-main"')[1].split("<!-- END Content -->")[0]
    assert "<script" not in content and "http" not in content  # CSS bars: no scripts, nothing fetched


def test_the_admin_metrics_page_takes_a_period_and_explains_a_bad_one(auditor_client, known_events) -> None:
    since = (NOW - dt.timedelta(days=9)).date().isoformat()
    page = auditor_client.get(f"/admin/audit/auditevent/metrics/?since={since}").content.decode()
    assert "729.3" in page  # p95 with the old 999 ms call: 100 + 0.7 × 899
    page = auditor_client.get("/admin/audit/auditevent/metrics/?since=soon").content.decode()
    assert "oon is not a date (YYYY-MM-DD)" in page  # the admin capitalizes messages


def test_the_metrics_pages_until_label_says_a_bare_date_includes_that_whole_day(auditor_client: Client) -> None:
    """The page reads a bare ``until`` date to the end of that day (as the list's filter does): its label says so,
    with the list filter's text, so that one translation serves both."""
    day = NOW.date().isoformat()
    for language, label in (("en", "to (a date: that whole day)"), ("ko", "종료 (날짜만 입력하면 그날 전체 포함)")):
        page = auditor_client.get(
            f"/admin/audit/auditevent/metrics/?until={day}", HTTP_ACCEPT_LANGUAGE=language
        ).content.decode()
        assert f'<label for="metrics-until">{label}</label>' in page
        assert "exclusive" not in page and "미포함" not in page


def test_the_audit_list_links_to_the_metrics_page_and_to_exports_of_what_it_shows(auditor_client) -> None:
    page = auditor_client.get("/admin/audit/auditevent/?mcp_id=company&ok=false").content.decode()
    assert 'href="/admin/audit/auditevent/metrics/"' in page
    # Failed: not an approval awaited (auditor.admin.NEUTRAL_REASONS), in the export as in the list.
    exported = "/api/v1/audit/events?mcp_id=company&amp;ok=false&amp;reason=%21approval%3Apending"
    assert f'href="{exported}&amp;format=csv"' in page
    assert f'href="{exported}&amp;format=jsonl"' in page


def test_eval_shadow_and_admin_trial_calls_stay_out_of_production_metrics_unless_asked_for(db) -> None:
    from auditor.selectors import AuditEventFilters

    AuditEvent.objects.bulk_create(
        [
            event(mcp_id="hr", tool="search_employee", latency_ms=10),
            event(mcp_id="hr", tool="search_employee", source="eval", latency_ms=20),
            event(mcp_id="hr", tool="search_employee", source="shadow", ok=False, reason="eval:write_blocked"),
            # The rule tester's "also call", refused: an admin's trial, no failing tool of live traffic.
            event(mcp_id="hr", tool="search_employee", source="admin", ok=False, reason="approval:unavailable"),
        ]
    )
    production = {(t.mcp_id, t.tool): t.calls for t in tool_metrics().tools}
    assert production == {("hr", "search_employee"): 1}
    evals = tool_metrics(filters=AuditEventFilters(source="eval")).tools
    assert [(t.tool, t.calls) for t in evals] == [("search_employee", 1)]
    trials = tool_metrics(filters=AuditEventFilters(source="admin")).tools
    assert [(t.tool, t.calls, t.errors) for t in trials] == [("search_employee", 1, 1)]


def test_a_period_too_long_for_hours_is_charted_by_the_day_or_only_counted(auditor_client, known_events) -> None:
    """An explicit ``bucket=hour`` over years was one point per hour for every charted tool, built in memory (a
    year 1 to 9999 request could take the web process down); it is charted by the day where days fit, and not
    charted at all (its totals shown) where even days are too many."""
    from auditor.metrics import MAX_BUCKETS, bucket_starts, series_bucket
    from auditor.selectors import moment_parse

    response = auditor_client.get("/admin/audit/auditevent/metrics/?since=2000-01-01&until=2026-01-01&bucket=hour")
    page = response.content.decode()
    assert response.status_code == 200
    assert "too long to chart (at most 2000 days)" in page
    response = auditor_client.get("/admin/audit/auditevent/metrics/?since=2024-01-01&until=2026-01-01&bucket=hour")
    assert "too long to chart by the hour; charted by the day" in response.content.decode()

    since, until = moment_parse("0001-01-01"), moment_parse("9999-12-31", end_of_day=True)
    assert series_bucket(since=since, until=until, asked="hour") is None
    assert len(bucket_starts(since=since, until=until, bucket="hour")) == MAX_BUCKETS + 1
