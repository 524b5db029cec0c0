"""The admin's landing page (agent_platform/dashboard.py): servers with their health and circuit, pending
approvals oldest first with one click to decide, the last day's runs by status, the tools failing most; each
panel for whoever may view what it lists. And "View site" leads somewhere real."""

from __future__ import annotations

import datetime as dt
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.models import Agent, Approval, Run
from audit.services import audit_event_record
from mcpregistry.models import McpServer

pytestmark = pytest.mark.django_db


def some_platform_state() -> dict[str, object]:
    McpServer.objects.create(mcp_id="healthy", name="ok", health="ok", command="true")
    McpServer.objects.create(
        mcp_id="broken",
        name="broken",
        health="error",
        breaker_state="open",
        last_error="connection refused",
        command="x",
    )
    agent = Agent.objects.create(slug="ledger", name="장부")
    failed = Run.objects.create(agent=agent, query="q", status=Run.Status.FAILED, error_code="model:error")
    Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED)
    parked = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
    old = Run.objects.create(agent=agent, query="q", status=Run.Status.FAILED)
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    approvals = []
    for minutes, tool in ((5, "newer"), (30, "older")):
        approval = Approval.objects.create(
            run=parked, mcp_id="notes", tool=tool, args={"text": "회의록"}, call_hash=tool.ljust(64, "0"),
            call_id=tool, expires_at=timezone.now() + timedelta(hours=1),
        )  # fmt: skip
        Approval.objects.filter(pk=approval.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))
        approvals.append(approval)
    for ok, tool in ((False, "flaky"), (False, "flaky"), (True, "flaky"), (True, "solid")):
        audit_event_record(
            source="agent", mcp_id="broken", tool=tool, ok=ok, reason="" if ok else "timeout", attempt=1,
            latency_ms=100.0 if tool == "flaky" else 5.0, actor="local",
        )  # fmt: skip
    return {"failed": failed, "newer": approvals[0], "older": approvals[1]}


def test_the_dashboard_shows_what_needs_an_admin_now(admin_client) -> None:
    state = some_platform_state()
    page = admin_client.get("/admin/").content.decode()
    # Pending approvals: the count, oldest first, one click to decide.
    assert 'id="dashboard-approvals"' in page and '<span class="badge badge-pending">2</span>' in page
    assert page.index("notes.<wbr>older") < page.index("notes.<wbr>newer")  # the name may break at its dot
    assert f"/admin/agents/approval/{state['older'].pk}/decide/approve/" in page  # type: ignore[attr-defined]
    assert f"/admin/agents/approval/{state['older'].pk}/decide/reject/" in page  # type: ignore[attr-defined]
    # Servers: health and circuit, and the failing one's last error with links.
    assert "broken" in page and "connection refused" in page and "open (calls refused)" in page
    assert "/admin/audit/auditevent/?mcp_id=broken&amp;ok=false" in page
    # Runs of the last 24 hours by status (the one from two days ago is not counted), the failed one linked.
    runs = page[page.index('id="dashboard-runs"') :]
    assert '<span class="big">3</span>' in runs
    assert f"/admin/agents/run/{state['failed'].pk}/change/" in runs  # type: ignore[attr-defined]
    assert "status__exact=failed" in runs
    # Tools with the highest error rate, with their p95.
    tools = page[page.index('id="dashboard-tools"') :]
    assert "broken.flaky" in tools and "broken.solid" not in tools  # a tool that never failed is not listed
    assert "66.7%" in tools and "100.0" in tools
    assert "/admin/audit/auditevent/metrics/" in tools and "/admin/agents/rule-tester/" in tools
    # Usage: no tokens this month (runs without a model), said so instead of two empty charts; the columns named.
    usage = page[page.index('id="dashboard-usage"') :]
    assert "No model has used tokens this month" in usage and "<svg" not in usage[: usage.index("</div>")]
    # Django's list of models is still there, below.
    assert page.index('id="platform-dashboard"') < page.index('class="app-agents')


def test_the_run_list_link_of_the_dashboard_works(admin_client) -> None:
    """It lists what the count counts: an evaluation's failed run is neither counted nor listed."""
    some_platform_state()
    agent = Agent.objects.get(slug="ledger")
    Run.objects.create(agent=agent, query="q", status=Run.Status.FAILED, purpose=Run.Purpose.EVAL)
    page = admin_client.get("/admin/").content.decode()
    assert '<span class="big">3</span>' in page[page.index('id="dashboard-runs"') :]
    start = page.index("/admin/agents/run/?status__exact=failed")
    url = page[start : page.index('"', start)].replace("&amp;", "&")
    response = admin_client.get(url)
    assert response.status_code == 200
    assert [r.status for r in response.context["cl"].result_list] == ["failed"]


def test_an_auditor_sees_runs_approvals_and_tools_but_no_servers_and_no_decide_links(auditor_client) -> None:
    state = some_platform_state()
    page = auditor_client.get("/admin/").content.decode()
    assert 'id="dashboard-approvals"' in page and 'id="dashboard-runs"' in page and 'id="dashboard-tools"' in page
    assert 'id="dashboard-servers"' not in page and "connection refused" not in page
    assert "/decide/" not in page
    assert f"/admin/agents/approval/{state['older'].pk}/change/" in page  # type: ignore[attr-defined]


def test_an_outsider_sees_no_panel(outsider_client) -> None:
    some_platform_state()
    page = outsider_client.get("/admin/").content.decode()
    assert "dashboard-" not in page


def test_the_dashboard_needs_a_login(client) -> None:
    response = client.get("/admin/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_view_site_leads_to_the_api_documentation(admin_client) -> None:
    page = admin_client.get("/admin/").content.decode()
    assert 'href="/api/v1/docs/"' in page
    assert admin_client.get("/api/v1/docs/").status_code == 200


def test_the_dashboard_charts_tokens_and_cost_per_day_and_lists_this_months_agents(admin_client) -> None:
    agent = Agent.objects.create(slug="spender", name="spender")
    Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED, tokens=1234, cost_micros=2_500_000)
    Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED, tokens=766, cost_micros=500_000)
    page = admin_client.get("/admin/").content.decode()
    assert 'id="dashboard-usage"' in page
    assert page.count('<svg class="chart"') >= 2
    today = timezone.now().astimezone(dt.UTC).date().isoformat()
    assert f"{today}: 2000" in page  # the bar of today's tokens
    assert f"{today}: $3.00" in page  # and of today's cost
    assert '<td>spender</td><td class="num">2</td><td class="num">2000</td><td class="num">$3.00</td>' in page
    assert '<span class="big">$3.00</span>' in page  # this month


def test_the_dashboard_writes_costs_as_dollars_not_as_floats(admin_client) -> None:
    """A month without cost reads $0.00 (not $0.0); a run's cost of 15 micro-dollars reads $0.000015 (a float
    printed it 1.5e-05), in the month's total, the agents' table and the chart's bars and scale."""
    page = admin_client.get("/admin/").content.decode()
    assert '<span class="big">$0.00</span>' in page
    agent = Agent.objects.create(slug="frugal", name="frugal")
    Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED, tokens=3, cost_micros=15)
    page = admin_client.get("/admin/").content.decode()
    today = timezone.now().astimezone(dt.UTC).date().isoformat()
    assert "e-05" not in page
    assert '<span class="big">$0.000015</span>' in page
    assert '<td class="num">$0.000015</td>' in page
    assert f"{today}: $0.000015" in page
    assert "max $0.000015" in page


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (None, "0.00"),
        (0, "0.00"),
        (15, "0.000015"),
        (12_300, "0.0123"),
        (500_000, "0.50"),
        (3_000_000, "3.00"),
        (1_234_500_000, "1,234.50"),
        (-2_500_000, "-2.50"),
        (14.9, "0.000015"),
    ],
)
def test_usd_text(micros, text) -> None:
    from agents.budgets import usd_text

    assert usd_text(micros) == text


@pytest.mark.django_db
def test_recent_actions_are_the_readers_own_changes_from_the_audit_record(admin_client, admin_user) -> None:
    """Django's "recent actions" read a log the platform never writes (it said 이용할 수 없습니다 after every change):
    the panel lists the reader's own configuration changes from the audit record, linked to their events."""
    from agents.services import agent_create

    agent_create(actor=admin_user, via="admin", data={"slug": "ledger", "name": "장부 도우미"})
    agent_create(actor="someone-else", via="admin", data={"slug": "other", "name": "남의 것"})
    page = admin_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    panel = page[page.index('id="recent-actions-module"') :]
    assert "내 변경 (감사 기록에서)" in panel and "에이전트 생성" in panel and "ledger" in panel
    assert "other" not in panel and "이용할 수 없습니다" not in panel
    assert "/admin/audit/auditevent/" in panel and "actor=" in panel  # each event, and all of them in the list


@pytest.mark.django_db
def test_recent_actions_say_none_yet_for_a_new_admin(auditor_client) -> None:
    page = auditor_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "아직 없습니다." in page[page.index('id="recent-actions-module"') :]


@pytest.mark.django_db
def test_tokens_without_a_price_say_so_instead_of_an_empty_cost_chart(admin_client) -> None:
    agent = Agent.objects.create(slug="unpriced", name="unpriced")
    Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED, tokens=530, cost_micros=0)
    page = admin_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    panel = page[page.index('id="dashboard-usage"') : page.index('id="dashboard-runs"')]
    assert panel.count('<svg class="chart"') == 1  # the tokens' chart only
    assert "이번 달 비용 없음" in panel and "/admin/agents/modelprice/" in panel


@pytest.mark.django_db
def test_a_servers_last_check_is_a_date_above_a_time(admin_client) -> None:
    McpServer.objects.create(mcp_id="crm", name="crm", command="python3", last_checked_at=timezone.now())
    page = admin_client.get("/admin/").content.decode()
    row = page[page.index('id="dashboard-servers"') :]
    assert '<span class="nowrap">' in row and "<br>" in row.split("</tr>")[1]


@pytest.mark.django_db
def test_my_changes_name_a_row_in_the_readers_language_and_a_deleted_one_as_recorded(admin_client, admin_user) -> None:
    """The record names a row in no language ("agent ledger / day" for a budget whoever changed it); the panel is
    read in Korean: a row still there and still so named is called as its page calls it, a deleted one keeps the
    name recorded."""
    from agents.budgets import budget_create
    from agents.services import agent_create, agent_delete

    agent = agent_create(actor=admin_user, via="admin", data={"slug": "ledger", "name": "장부 도우미"})
    budget_create(actor=admin_user, via="admin", data={"agent": agent, "period": "day", "max_tokens": 100_000})
    gone = agent_create(actor=admin_user, via="admin", data={"slug": "gone", "name": "지운 것"})
    agent_delete(agent=gone, actor=admin_user, via="admin")
    page = admin_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    panel = page[page.index('id="recent-actions-module"') :]
    panel = panel[: panel.index("</ul>")]
    assert "에이전트 ledger / 일" in panel and "agent ledger / day" not in panel
    assert "gone" in panel  # deleted: as recorded
