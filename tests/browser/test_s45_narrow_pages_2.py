"""More admin pages in a real browser at 800 and 1,280 px, in English and Korean, Django's menu open (review s45):
the MCP discovery tables squeezed their descriptions to two letters a line; the MCP server and tool lists hid
their key columns beside their filter (and the tools list's action menu scrolled the page); the approval's pages,
a history page and the agent page (its chosen servers box, its flow graph menu) went past the window or were cut
by their row; the tool metrics broke a tool's name after any letter. Each now fits the window, or scrolls inside
a box of its own that does; nothing is cut, and words and names break only between their parts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agent_platform.celery import app as celery_app
from agents.execution import run_execute
from agents.models import Agent, Run
from audit.services import audit_event_record
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_update, mcp_tool_update
from tests.browser.conftest import pages_in_both_languages
from tests.browser.test_audit_list import squeezed_cells
from tests.browser.test_s45_narrow_pages import LONG_TOOL, PAGE_WIDTH, PAST_THEIR_BOX
from tests.conftest import bind_demo_server, discover_as_admin, make_agent

pytestmark = pytest.mark.browser

# Each table matching ``arguments[0]`` that ends past the box it sits in, unless it scrolls sideways in a box of its
# own (a table wider than a narrow page scrolls there, never the page; at 1,280 px, ``arguments[1]``, none is wider).
TABLES_PAST_THEIR_BOX = """return [...document.querySelectorAll(arguments[0])].filter(t => t.getClientRects().length)
.map(t => {
    let scroller = t.parentElement;
    while (scroller && !['auto', 'scroll'].includes(getComputedStyle(scroller).overflowX)) {
        scroller = scroller.parentElement;
    }
    return {table: Math.round(t.getBoundingClientRect().right), scrolls: Boolean(scroller),
            box: Math.round(t.parentElement.getBoundingClientRect().right)};
}).filter(t => t.table > t.box + 1 && (arguments[1] >= 1280 || !t.scrolls));"""


def test_the_discovery_tables_keep_their_words_whole(admin_in_browser: Any) -> None:
    server = bind_demo_server()
    tool = McpTool.objects.get(server=server, name="get_asset_status")
    browser = admin_in_browser
    problems = {}
    for path, name in (
        (f"/admin/mcpregistry/mcpserver/{server.pk}/change/", "s45-server-discovery"),
        (f"/admin/mcpregistry/mcptool/{tool.pk}/change/", "s45-tool-discovery"),
    ):
        for language, width in pages_in_both_languages(browser, path, name):
            cells = "table.discovery-table :is(th, td)"
            assert len(browser.find_elements("css selector", cells)) > 8
            page = browser.execute_script(PAGE_WIDTH)
            squeezed = squeezed_cells(browser, cells)
            tables = browser.execute_script(TABLES_PAST_THEIR_BOX, "table.discovery-table", width)
            cut = browser.execute_script(PAST_THEIR_BOX, ".form-row .readonly:has(table.discovery-table)")
            if page[0] > page[1] or squeezed or tables or cut:
                problems[(name, language, width)] = (page, squeezed, tables, cut)
    assert problems == {}


@pytest.fixture
def two_servers(transactional_db: Any) -> Iterator[list[McpServer]]:
    """The demo server and a second real one (its notes tool writes), both discovered."""
    demo = bind_demo_server()
    notes = McpServer.objects.create(
        mcp_id="company-notes-and-meeting-minutes", name="회의록 노트", command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"], cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(Path(settings.VAR_DIR) / "s45-notes.txt")}, session_scope="shared",
    )  # fmt: skip
    assert discover_as_admin(server=notes).ok
    yield [demo, notes]
    get_default_pool().close(notes.mcp_id)
    get_default_pool().close(demo.mcp_id)


def test_the_mcp_lists_show_every_column_and_their_action_menu_fits(
    admin_in_browser: Any, two_servers: list[McpServer]
) -> None:
    browser = admin_in_browser
    problems = {}
    lists = (("/admin/mcpregistry/mcpserver/", "s45-server-list"), ("/admin/mcpregistry/mcptool/", "s45-tool-list"))
    for path, name in lists:
        for language, width in pages_in_both_languages(browser, path, name):
            assert len(browser.find_elements("css selector", "#result_list tbody tr")) >= 2
            page = browser.execute_script(PAGE_WIDTH)
            # At 1,280 px every column's header is in sight beside the filter, none reached only by scrolling the
            # list sideways; at 800 px the filter goes under the list, which takes the page's width (and scrolls
            # in its own box where its columns need more).
            shown = "#changelist-form select[name=action]" + (", #result_list thead th" if width >= 1280 else "")
            cut = browser.execute_script(PAST_THEIR_BOX, shown)
            results, whole = browser.execute_script(
                "return ['#changelist .results', '#changelist']"
                ".map(s => Math.round(document.querySelector(s).getBoundingClientRect().width));"
            )
            if page[0] > page[1] or cut or (width < 1280 and results < whole - 2):
                problems[(name, language, width)] = (page, cut, results, whole)
    assert problems == {}


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def test_the_approval_pages_fit_the_window(
    admin_in_browser: Any, two_servers: list[McpServer], eager_tasks: None
) -> None:
    """A real run: the model reads an asset's status from the demo server, then asks to write a note, which waits."""
    script = [
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
        {"tool_calls": [{"name": "append_note", "args": {"text": "A-1001 자산 점검 결과를 회의록에 남깁니다."}}]},
        {"content": "회의록에 남겼습니다."},
    ]
    agent = make_agent(
        slug="company-assistant", servers=two_servers, provider="scripted", script=script, with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, query="A-1001 자산 상태를 확인하고 회의록에 남겨 주세요.")
    run_execute(run_id=str(run.pk))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL, (run.status, run.error_code, run.error_message)
    approval = run.approvals.get()
    browser = admin_in_browser
    problems = {}
    for page_path, name in (("change", "s45-approval"), ("decide/approve", "s45-approval-decide")):
        path = f"/admin/agents/approval/{approval.pk}/{page_path}/"
        for language, width in pages_in_both_languages(browser, path, name):
            assert len(browser.find_elements("css selector", ".approval-trace li.step")) >= 2
            page = browser.execute_script(PAGE_WIDTH)
            cut = browser.execute_script(
                PAST_THEIR_BOX, ".approval-trace :is(h3, li.step), .approval-main :is(h2, h3, p, table, textarea)"
            )
            if page[0] > page[1] or cut:
                problems[(name, language, width)] = (page, cut)
    assert problems == {}


def test_the_history_pages_fit_the_window(admin_in_browser: Any, two_servers: list[McpServer]) -> None:
    server = two_servers[0]
    for data in (
        {"name": "SDS 사내 데이터 (자산·직원·프로젝트)", "timeout_s": 15},
        {"breaker_threshold": 3, "breaker_cooldown_s": 60.0, "session_scope": "per_run", "tool_prefix": "sds"},
        {"enabled": False},
    ):
        mcp_server_update(server=server, actor="admin", via="admin", data=data)
    tool = McpTool.objects.get(server=server, name="get_asset_status")
    mcp_tool_update(tool=tool, actor="admin", via="admin", data={"enabled": False})
    browser = admin_in_browser
    problems = {}
    for path, name in (
        (f"/admin/mcpregistry/mcpserver/{server.pk}/history/", "s45-server-history"),
        (f"/admin/mcpregistry/mcptool/{tool.pk}/history/", "s45-tool-history"),
    ):
        for language, width in pages_in_both_languages(browser, path, name):
            assert len(browser.find_elements("css selector", "#change-history tbody tr")) >= 2
            page = browser.execute_script(PAGE_WIDTH)
            # At 800 px the table may scroll in its own box; at 1,280 px it fits whole.
            cut = browser.execute_script(PAST_THEIR_BOX, "#change-history :is(th, td)") if width >= 1280 else []
            tables = browser.execute_script(TABLES_PAST_THEIR_BOX, "#change-history", width)
            squeezed = squeezed_cells(browser, "#change-history :is(th, td)")
            if page[0] > page[1] or cut or tables or squeezed:
                problems[(name, language, width)] = (page, cut, tables, squeezed)
    assert problems == {}


def test_the_agent_pages_servers_and_flow_graph_fit_their_rows(
    admin_in_browser: Any, two_servers: list[McpServer]
) -> None:
    react = make_agent(slug="company-assistant", servers=two_servers)
    flow = make_agent(slug="asset-status-flow", servers=two_servers, with_demo_rules=False)
    Agent.objects.filter(pk=flow.pk).update(mode=Agent.Mode.FLOW, flow_graph="agents.flows.http_pipeline.build_graph")
    browser = admin_in_browser
    problems = {}
    for agent in (react, flow):
        path = f"/admin/agents/agent/{agent.pk}/change/"
        for language, width in pages_in_both_languages(browser, path, f"s45-agent-{agent.slug}"):
            shown = (
                ".field-servers :is(.selector-available, .selector-chooser, .selector-chosen, select, option, a)"
                ", .field-flow_graph select, .field-mode select"
            )
            assert len(browser.find_elements("css selector", ".field-servers .selector-chosen option")) == 2
            # The stylesheet that fits them is loaded in either mode (a flow agent's tool settings are hidden).
            sheets = browser.execute_script("return [...document.styleSheets].map(s => s.href || '')")
            loaded = any(sheet.endswith("agents/agent_settings.css") for sheet in sheets)
            page = browser.execute_script(PAGE_WIDTH)
            cut = browser.execute_script(PAST_THEIR_BOX, shown)
            rows = browser.execute_script(
                """return [...document.querySelectorAll('.form-row.field-servers, .form-row.field-flow_graph')]
                .filter(r => r.getClientRects().length && r.scrollWidth > r.clientWidth)
                .map(r => [r.className, r.scrollWidth, r.clientWidth]);"""
            )
            if not loaded or page[0] > page[1] or cut or rows:
                problems[(agent.slug, language, width)] = (loaded, page, cut, rows)
    assert problems == {}


def test_the_tool_metrics_break_a_tools_name_between_its_parts(admin_in_browser: Any) -> None:
    for tool in ("get_asset_status", LONG_TOOL, "직원_검색_및_소속_팀_자산_현황_조회"):
        for ok, latency in ((True, 12.5), (False, 3246.04), (True, 1507.7)):
            audit_event_record(
                source="agent", mcp_id="company-notes-and-asset-data", tool=tool, ok=ok,
                reason="" if ok else "timeout", attempt=1, latency_ms=latency, actor="api_key:apk__gdi8Fbs",
            )  # fmt: skip
    browser = admin_in_browser
    problems = {}
    for language, width in pages_in_both_languages(browser, "/admin/audit/auditevent/metrics/", "s45-metrics-names"):
        names = "#content-main :is(td.tool-name, table.series td:first-child)"
        assert LONG_TOOL in browser.find_element("id", "content-main").text.replace("\n", "")
        squeezed = squeezed_cells(browser, names)
        page = browser.execute_script(PAGE_WIDTH)
        tables = browser.execute_script(TABLES_PAST_THEIR_BOX, "#content-main table", width)
        if squeezed or page[0] > page[1] or tables:
            problems[(language, width)] = (squeezed, page, tables)
    assert problems == {}
