"""The admin's pages read the same number of queries whatever the number of rows (a reviewer measured them at
200,000 audit events, 50,000 runs, 1,000 agent versions and 300 tools):

- an agent's page offers only its own versions as the live and the shadow version, each read with its agent
  (it read one query per version of every agent: 1,032 queries);
- the audit and run lists' date drill-down is built from the first and the last date (two reads off the date's
  index), no ``SELECT DISTINCT`` over a truncation of every row's date (1.2 s a page at 200,000 events);
- the audit list's tool and action filters read their choices from an index that holds them (migration
  audit/0017), not from the table;
- the rule pages read the tool catalogue's servers with the tools (one query per tool);
- the tool, server and budget lists read each row's server, contract, tool count, agent, key and period's use
  with the page (one query per row each)."""

from __future__ import annotations

import datetime as dt
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.budgets import budget_create, period_bounds
from agents.models import Agent, AgentVersion, ApiKey, Budget, BudgetUsage, Run
from audit.services import audit_event_record
from mcpregistry.models import McpServer, McpTool, ToolContract

pytestmark = pytest.mark.django_db


def queries_of(client: Client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.status_code
    return [query["sql"] for query in captured.captured_queries]


def counts_at_two_sizes(client: Client, url: str, add_rows: Callable[[int], None]) -> tuple[int, int]:
    """The page's query count with 2 rows, then with 20 (after a first visit, which may fill a cache)."""
    add_rows(2)
    queries_of(client, url)
    few = len(queries_of(client, url))
    add_rows(18)
    return few, len(queries_of(client, url))


def versions_of(agent: Agent, count: int) -> None:
    start = AgentVersion.objects.filter(agent=agent).count()
    for number in range(start + 1, start + count + 1):
        AgentVersion.objects.create(agent=agent, number=number, content={}, digest=f"{number:064d}")


# --- the agent's page -------------------------------------------------------------------------------------------


def test_an_agents_page_offers_its_own_versions_read_with_their_agent(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="상담-agent", name="상담")
    other = Agent.objects.create(slug="other", name="other")
    url = f"/admin/agents/agent/{agent.pk}/change/"

    def add_rows(count: int) -> None:
        versions_of(agent, count)
        versions_of(other, count)

    few, many = counts_at_two_sizes(admin_client, url, add_rows)
    assert few == many
    page = admin_client.get(url).content.decode()
    for name in ("live_version", "shadow_version"):
        select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', page, re.S)
        assert select is not None
        offered = re.findall(r'<option value="(\d+)"', select.group(1))
        assert sorted(map(int, offered)) == sorted(agent.versions.values_list("pk", flat=True))


def test_a_new_agents_page_offers_no_version(admin_client: Client) -> None:
    versions_of(Agent.objects.create(slug="other", name="other"), 3)
    page = admin_client.get("/admin/agents/agent/add/").content.decode()
    for name in ("live_version", "shadow_version"):
        select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', page, re.S)
        assert select is not None and not re.findall(r'<option value="\d+"', select.group(1))


# --- the date drill-down ----------------------------------------------------------------------------------------


def truncations(queries: list[str]) -> list[str]:
    return [sql for sql in queries if "DISTINCT" in sql.upper() and "TRUNC" in sql.upper()]


def test_the_audit_lists_drill_down_truncates_no_rows_and_its_queries_do_not_grow(auditor_client: Client) -> None:
    def add_rows(count: int) -> None:
        for n in range(count):
            audit_event_record(source="agent", mcp_id="crm", tool=f"조회{n % 3}", actor="김하늘")

    url = "/admin/audit/auditevent/"
    few, many = counts_at_two_sizes(auditor_client, url, add_rows)
    assert few == many
    now = timezone.localtime()
    for query in ("", f"?created_at__year={now.year}", f"?created_at__year={now.year}&created_at__month={now.month}"):
        queries = queries_of(auditor_client, url + query)
        assert truncations(queries) == [], truncations(queries)
        assert not [sql for sql in queries if "MIN(" in sql.upper() and "MAX(" in sql.upper()]
    page = auditor_client.get(url).content.decode()  # every event today: the drill-down starts at its days
    assert f"created_at__day={now.day}" in page


def runs_at(agent: Agent, *moments: dt.datetime) -> None:
    for moment in moments:
        run = Run.objects.create(agent=agent, query="김하늘 님은 어느 팀 소속인가요?")
        Run.objects.filter(pk=run.pk).update(created_at=moment)


def test_the_run_lists_drill_down_links_every_period_between_the_first_and_the_last_run(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="ledger", name="ledger")
    zone = timezone.get_current_timezone()
    runs_at(
        agent,
        dt.datetime(2025, 11, 20, 9, tzinfo=zone),
        dt.datetime(2026, 2, 3, 9, tzinfo=zone),
        dt.datetime(2026, 2, 5, 9, tzinfo=zone),
    )
    url = "/admin/agents/run/"
    queries = queries_of(admin_client, url)
    assert truncations(queries) == []
    top = admin_client.get(url).content.decode()
    assert "created_at__year=2025" in top and "created_at__year=2026" in top
    months = admin_client.get(f"{url}?created_at__year=2025").content.decode()
    # The months between the year's first and last run listed: here November alone.
    assert "created_at__month=11" in months
    assert "created_at__month=10" not in months and "created_at__month=12" not in months
    days = admin_client.get(f"{url}?created_at__year=2026&created_at__month=2").content.decode()
    assert [d for d in range(1, 29) if f"created_at__day={d}&" in days or f'created_at__day={d}"' in days] == [3, 4, 5]
    listed = admin_client.get(f"{url}?created_at__year=2026&created_at__month=2&created_at__day=3").content
    assert listed.decode().count("/change/") >= 1


def test_the_run_lists_drill_down_reads_the_rows_its_filters_leave(admin_client: Client) -> None:
    zone = timezone.get_current_timezone()
    ledger = Agent.objects.create(slug="ledger", name="ledger")
    other = Agent.objects.create(slug="other", name="other")
    runs_at(ledger, dt.datetime(2026, 2, 3, 9, tzinfo=zone), dt.datetime(2026, 2, 5, 9, tzinfo=zone))
    runs_at(other, dt.datetime(2025, 11, 20, 9, tzinfo=zone))
    page = admin_client.get(f"/admin/agents/run/?agent__id__exact={ledger.pk}").content.decode()
    # The filtered runs are all of one month: the drill-down starts at their days, as Django's does.
    assert "created_at__year=2025" not in page and "created_at__day=3" in page


def test_the_run_lists_queries_do_not_grow_with_runs(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="ledger", name="ledger")
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)

    def add_rows(count: int) -> None:
        runs_at(agent, *(start + dt.timedelta(days=40 * n) for n in range(Run.objects.count(), count)))

    few, many = counts_at_two_sizes(admin_client, "/admin/agents/run/", add_rows)
    assert few == many


# --- the audit list's filters -----------------------------------------------------------------------------------


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's query plans")
def test_the_tool_and_action_filters_read_their_choices_from_a_covering_index(auditor_client: Client) -> None:
    audit_event_record(source="agent", mcp_id="crm", tool="조회", actor="x")
    audit_event_record(source="admin", action="config.mcp_tool.update", mcp_id="crm", tool="조회", actor="x")
    queries = queries_of(auditor_client, "/admin/audit/auditevent/")
    tool_choices = [sql for sql in queries if re.match(r'SELECT DISTINCT "audit_auditevent"\."tool"', sql)]
    action_choices = [sql for sql in queries if re.match(r'SELECT DISTINCT "audit_auditevent"\."action"', sql)]
    assert len(tool_choices) == 1 and len(action_choices) == 1
    with connection.cursor() as cursor:
        for sql, index in (
            (tool_choices[0], "audit_event_tool_action_idx"),
            (action_choices[0], "audit_event_action_idx"),
        ):
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = " | ".join(str(row[-1]) for row in cursor.fetchall())
            assert f"COVERING INDEX {index}" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


# --- the rule pages ---------------------------------------------------------------------------------------------


def tools_on(server: McpServer, count: int) -> None:
    start = server.tools.count()
    for n in range(start, start + count):
        tool = McpTool.objects.create(server=server, name=f"tool_{n}", input_schema={"type": "object"})
        ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}})


def test_the_new_rule_page_reads_the_tools_servers_with_the_tools(admin_client: Client) -> None:
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    few, many = counts_at_two_sizes(
        admin_client, "/admin/agents/deterministicrule/add/", lambda count: tools_on(server, count)
    )
    assert few == many


# --- the lists --------------------------------------------------------------------------------------------------


def test_the_tool_list_reads_each_tools_server_and_contract_with_the_page(admin_client: Client) -> None:
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    few, many = counts_at_two_sizes(admin_client, "/admin/mcpregistry/mcptool/", lambda count: tools_on(server, count))
    assert few == many


def test_the_server_list_counts_the_tools_with_the_page_and_sorts_by_the_count(admin_client: Client) -> None:
    def add_rows(count: int) -> None:
        for _ in range(count):
            server = McpServer.objects.create(
                mcp_id=f"server-{McpServer.objects.count()}", name="서버", command=sys.executable, args=[]
            )
            tools_on(server, McpServer.objects.count() % 4)
            McpTool.objects.create(server=server, name="gone", input_schema={}, available=False)

    few, many = counts_at_two_sizes(admin_client, "/admin/mcpregistry/mcpserver/", add_rows)
    assert few == many
    page = admin_client.get("/admin/mcpregistry/mcpserver/?o=8").content.decode()  # by the tool count
    counts = [int(n) for n in re.findall(r'<td class="field-tool_count">(\d+)</td>', page)]
    assert counts == sorted(counts) and len(counts) == 20
    assert counts == sorted(server.tools.filter(available=True).count() for server in McpServer.objects.all())


def test_the_budget_list_reads_agents_keys_and_this_periods_use_with_the_page(admin_client: Client) -> None:
    now = timezone.now()

    def add_rows(count: int) -> None:
        for _ in range(count):
            n = Budget.objects.count()
            agent = Agent.objects.create(slug=f"agent-{n}", name="에이전트")
            key = ApiKey.objects.create(name=f"키 {n}", prefix=f"apk_{n:04d}", digest=f"{n:064d}")
            period = ["day", "month"][n % 2]
            for owner in ({"agent": agent}, {"api_key": key}):
                budget = budget_create(
                    actor="test-admin", via="tests", data={**owner, "period": period, "max_tokens": 100_000}
                )
                start = period_bounds(period, now)[0]
                BudgetUsage.objects.create(budget=budget, period_start=start, used_tokens=7 + n, reserved_tokens=3)
                BudgetUsage.objects.create(budget=budget, period_start=start - dt.timedelta(days=40), used_tokens=999)

    few, many = counts_at_two_sizes(admin_client, "/admin/agents/budget/", add_rows)
    assert few == many
    page = admin_client.get("/admin/agents/budget/").content.decode()
    used = re.findall(r'<td class="field-used_now">(\d+) tokens, .*?\(reserved: (\d+) tokens\)</td>', page)
    assert sorted(used) == sorted((str(7 + n), "3") for n in range(0, 40, 2) for _owner in range(2))


def test_a_budgets_use_this_period_is_read_the_same_with_or_without_the_pages_rows(admin_client: Client) -> None:
    from agents.budgets import budget_state, budgets_with_current_usage

    agent = Agent.objects.create(slug="ledger", name="ledger")
    now = timezone.now()
    for period in ("day", "month"):
        budget = budget_create(actor="t", via="tests", data={"agent": agent, "period": period, "max_tokens": 100_000})
        BudgetUsage.objects.create(budget=budget, period_start=period_bounds(period, now)[0], used_tokens=4)
    listed: Any = budgets_with_current_usage(Budget.objects.all(), now=now)
    for budget in listed:
        assert budget_state(budget, now=now, usages=budget.current_usage) == budget_state(budget, now=now)
