"""Three admin pages in a real browser at 800 and 1,280 px, in English and Korean (review s45): at 800 px the tool
metrics' per-tool table, the rules list's "enabled" column and the agent page's MCP-context and tool-selection
editors went past the window (or past their own box), so the page or the list scrolled sideways. Each now fits
the window, or scrolls inside a box of its own that does; nothing is cut."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.conf import settings

from agents.models import Agent, DeterministicRule
from audit.services import audit_event_record
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_discover
from tests.browser.conftest import pages_in_both_languages, screenshot
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.browser

PAGE_WIDTH = "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];"
LONG_TOOL = "append_meeting_note_to_shared_notebook_with_attachments"
LONG_RULE = "사번 또는 이름으로 직원을 찾고 소속 팀과 자산 현황을 함께 알려주는 규칙"

# The elements matching ``arguments[0]`` that end past the window, or past a box of theirs that clips or scrolls
# (``overflow`` not visible): cut off, or reached only by scrolling sideways.
PAST_THEIR_BOX = """const width = document.documentElement.clientWidth;
return [...document.querySelectorAll(arguments[0])].filter(e => {
    const box = e.getBoundingClientRect();
    if (!box.width) return false;
    let edge = width;
    for (let up = e.parentElement; up; up = up.parentElement) {
        if (getComputedStyle(up).overflowX !== 'visible') edge = Math.min(edge, up.getBoundingClientRect().right);
    }
    return box.right > edge + 1;
}).map(e => `${e.tagName.toLowerCase()}[${e.name || e.textContent.trim().slice(0, 30)}] ${Math.round(e.getBoundingClientRect().right)}`);"""

# The lines each element matching ``arguments[0]`` is drawn on.
LINES = """return [...document.querySelectorAll(arguments[0])].map(e => {
    const r = document.createRange(); r.selectNodeContents(e.firstChild || e);
    return new Set([...r.getClientRects()].map(t => Math.round(t.top))).size;
});"""


def test_the_tool_metrics_fit_the_window_or_scroll_in_their_own_box(admin_in_browser: Any) -> None:
    for tool in ("get_asset_status", LONG_TOOL, "직원_검색_및_소속_팀_자산_현황_조회"):
        for ok, reason, latency, actor in (
            (True, "", 12.5, "api_key:apk__gdi8Fbs"),
            (False, "args:allowed:region", 0.4, "api_key:apk__gdi8Fbs"),
            (False, "timeout", 3246.04, "admin:admin"),
            (True, "", 1507.7, "local"),
        ):
            audit_event_record(
                source="agent", mcp_id="company-notes-and-asset-data", tool=tool, ok=ok, reason=reason,
                attempt=1, latency_ms=latency, actor=actor,
            )  # fmt: skip
    browser = admin_in_browser
    problems = {}
    for language, width in pages_in_both_languages(browser, "/admin/audit/auditevent/metrics/", "s45-metrics"):
        assert LONG_TOOL in browser.find_element("id", "content-main").text
        page = browser.execute_script(PAGE_WIDTH)
        tables = browser.execute_script(
            """return [...document.querySelectorAll('#content-main table')].map(t => {
                const box = t.parentElement;
                return {scrolls: getComputedStyle(box).overflowX, table: Math.round(t.getBoundingClientRect().right),
                        box: Math.round(box.getBoundingClientRect().right)};
            });"""
        )
        # Wider than its box, a table scrolls inside it (only at 800 px: at 1,280 px every table fits).
        unreachable = [
            t for t in tables if t["table"] > t["box"] + 1 and (width >= 1280 or t["scrolls"] not in ("auto", "scroll"))
        ]
        numbers = browser.execute_script(LINES, "#content-main td.num")
        if page[0] > page[1] or unreachable or any(n > 1 for n in numbers):
            problems[(language, width)] = (page, unreachable, numbers)
    assert problems == {}


def test_the_rules_lists_enabled_column_is_in_sight_at_800_and_1280(admin_in_browser: Any) -> None:
    server = bind_demo_server()
    agent = make_agent(slug="company-assistant", servers=[server])
    DeterministicRule.objects.create(
        agent=agent, server=server, name=LONG_RULE, order=300, tool_name="search_employee",
        when={"regex": r"(?P<name>[가-힣]{2,4})\s*님", "data": {"order.assetId": "*"}},
        params={"name": "{match.name}"},
    )  # fmt: skip
    browser = admin_in_browser
    problems = {}
    for language, width in pages_in_both_languages(browser, "/admin/agents/deterministicrule/", "s45-rules-list"):
        assert browser.find_elements("css selector", "#result_list td.field-enabled img")
        page = browser.execute_script(PAGE_WIDTH)
        cut = browser.execute_script(
            PAST_THEIR_BOX, "#result_list th.column-enabled, #result_list td.field-enabled img, #result_list td a"
        )
        results = browser.execute_script(
            "const r = document.querySelector('#changelist .results'); return [r.scrollWidth, r.clientWidth];"
        )
        if page[0] > page[1] or cut or results[0] > results[1]:
            problems[(language, width)] = (page, cut, results)
    assert problems == {}


@pytest.fixture
def context_agent(transactional_db: Any) -> Agent:
    """An agent bound to the demo server and to a server with a resource and a prompt (both real stdio
    processes), its tool selection and MCP context filled in: a long tool pinned and forced first, Korean tags."""
    demo = bind_demo_server()
    context = McpServer.objects.create(
        mcp_id="company-notes-and-meeting-context", name="context", command=sys.executable,
        args=["-m", "tests.mcp_fixtures.context_server"], cwd=str(settings.BASE_DIR), session_scope="shared",
    )  # fmt: skip
    assert mcp_server_discover(server=context, actor="test", via="tests").ok
    agent = make_agent(slug="company-assistant", servers=[demo, context], with_demo_rules=False)
    agent.tool_selection = {
        "enabled": True, "top_k": 5, "pinned": ["get_asset_status", LONG_TOOL], "force_first_tool": LONG_TOOL,
        "servers": [demo.mcp_id, context.mcp_id], "tags": ["자산 관리", "직원 검색", "회의록 공유 노트"],
    }  # fmt: skip
    agent.mcp_context = {
        "resources": [{"mcp_id": context.mcp_id, "uri": "notes://doc"}],
        "prompt": {"mcp_id": context.mcp_id, "name": "p", "arguments": {"q": "{query}"}},
    }
    agent.save()
    return agent


def test_the_agents_context_and_tool_selection_editors_fit_the_window(
    admin_in_browser: Any, context_agent: Agent
) -> None:
    browser = admin_in_browser
    problems = {}
    for language, width in pages_in_both_languages(
        browser, f"/admin/agents/agent/{context_agent.pk}/change/", "s45-agent-settings"
    ):
        shown = ".agent-settings :is(label, input, select, textarea, code, span, summary)"
        assert len(browser.find_elements("css selector", shown)) > 20
        # The JSON views are folded: open them, as a person editing the JSON would.
        browser.execute_script("document.querySelectorAll('.agent-settings details').forEach(d => d.open = true)")
        cut = browser.execute_script(PAST_THEIR_BOX, shown)
        editors = browser.execute_script(
            """return [...document.querySelectorAll('.agent-settings')].map(e => {
                const row = e.closest('.form-row');
                return [e.dataset.field, Math.round(e.getBoundingClientRect().right), row.scrollWidth, row.clientWidth];
            });"""
        )
        for editor in browser.find_elements("css selector", ".agent-settings"):
            row = editor.find_element("xpath", "./ancestor::div[contains(@class, 'form-row')]")
            browser.execute_script("arguments[0].scrollIntoView()", row)
            name = editor.get_attribute("data-field").replace("_", "-")
            row.screenshot(str(screenshot(browser, f"s45-agent-{name}-{language}-{width}")))
        page = browser.execute_script(PAGE_WIDTH)
        if cut or any(e[2] > e[3] for e in editors) or page[0] > page[1]:
            problems[(language, width)] = (cut, editors, page)
    assert problems == {}
