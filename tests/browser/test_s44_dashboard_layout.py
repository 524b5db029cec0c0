"""The dashboard's pending approvals and the tool metrics' charts in a real browser at 1,280 and 800 px, in English
and Korean (review s44): with three pending calls (long Korean arguments, a long tool name) the Approve…/Reject…
links ended past the approvals panel's edge and the panel scrolled sideways; the charts' "max …" labels were SVG
text the chart's viewBox scaled down to about 6 px high."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Approval, Run
from audit.services import audit_event_record
from tests.browser.conftest import pages_in_both_languages
from tests.conftest import make_agent

pytestmark = pytest.mark.browser

ARGUMENTS = (
    {"text": "회의록 저장: 오늘 회의에서 결정된 내용을 정리하고 담당자에게 공유합니다. " * 4, "notebook_id": "nb-1"},
    {"text": "회의록저장오늘회의에서결정된내용을정리합니다" * 6, "notebook_id": "nb-2"},
    {"url": "https://wiki.example.com/pages/" + "meeting-notes-2026-12-06-" * 8},
)
LONG_TOOL = "append_meeting_note_to_shared_notebook_with_attachments"


def test_the_dashboards_decision_links_are_inside_the_approvals_panel_which_never_scrolls_sideways(
    admin_in_browser: Any,
) -> None:
    agent = make_agent(slug="company-assistant", servers=[], with_demo_rules=False)
    run = Run.objects.create(
        agent=agent, query="오늘 회의록을 공유 노트에 저장해줘", status=Run.Status.AWAITING_APPROVAL
    )
    for index, args in enumerate(ARGUMENTS):
        Approval.objects.create(
            run=run, mcp_id="company-notes", tool=LONG_TOOL if index == 0 else "append_note", args=args,
            call_hash=str(index) * 64, call_id=f"c{index}", requested_by="api_key:apk__gdi8Fbs",
            expires_at=timezone.now() + timedelta(hours=1),
        )  # fmt: skip
    browser = admin_in_browser
    problems = {}
    for language, width in pages_in_both_languages(browser, "/admin/", "dashboard-approvals"):
        found = browser.execute_script(
            """const panel = document.querySelector('#dashboard-approvals'), box = panel.getBoundingClientRect();
            const links = [...panel.querySelectorAll('.approve-link, .reject-link')];
            return {links: links.length, scroll: [panel.scrollWidth, panel.clientWidth],
                    cut: links.filter(a => { const r = a.getBoundingClientRect();
                                             return r.left < box.left - 1 || r.right > box.right + 1; })
                              .map(a => `${a.textContent} ${Math.round(a.getBoundingClientRect().right)}`
                                        + ` > ${Math.round(box.right)}`)};"""
        )
        assert found["links"] == 6, (language, width)
        if found["cut"] or found["scroll"][0] > found["scroll"][1]:
            problems[(language, width)] = found
    assert problems == {}


def test_the_tool_metrics_charts_labels_are_readable(admin_in_browser: Any) -> None:
    for tool in ("get_asset_status", LONG_TOOL):  # a long name leaves the charts less room
        for ok, latency in ((True, 10.0), (False, 3246.04), (True, 20.0)):
            audit_event_record(
                source="agent", mcp_id="company-notes", tool=tool, ok=ok, reason="" if ok else "timeout",
                attempt=1, latency_ms=latency, actor="local",
            )  # fmt: skip
    browser = admin_in_browser
    small = {}
    wider = {}
    for language, width in pages_in_both_languages(
        browser, "/admin/audit/auditevent/metrics/?bucket=hour", "metrics-charts"
    ):
        # A long tool name breaks where it must: whole, it pushed the page past the window at 1280 px.
        page, window = browser.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        if width >= 1280 and page > window:
            wider[(language, width)] = (page, window)
        # The height each chart's scale label is drawn at, wherever it is (SVG text or HTML beside the chart).
        heights = browser.execute_script(
            """const words = /^(max|최대) /;
            const walker = document.createTreeWalker(document.querySelector('#content-main'),
                                                     NodeFilter.SHOW_TEXT);
            const found = [];
            while (walker.nextNode()) {
                const node = walker.currentNode;
                if (!words.test(node.textContent.trim())) continue;
                const range = document.createRange(); range.selectNodeContents(node);
                const parent = node.parentElement;  // a range over SVG text measures nothing: its element does
                const box = parent instanceof SVGElement ? parent.getBoundingClientRect() : range.getBoundingClientRect();
                found.push([node.textContent.trim(), Math.round(box.height * 10) / 10]);
            }
            return found;"""
        )
        assert len(heights) == 9, (language, width, heights)  # all tools, and each tool: calls, error rate, p95
        low = [label for label in heights if label[1] < 10]
        if low:
            small[(language, width)] = low
    assert small == {}
    assert wider == {}
