"""A pending approval's arguments, short or long, in a real browser at 1,440 px (review defects): on the dashboard
the arguments did not wrap, so the table grew sideways and pushed Approve…/Reject… past the panel's edge; on the
approval's page and its confirmation a long value squeezed the names' column until names read letter by letter
(no/te/bo/ok/_i/d)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from agents.models import Approval, Run
from tests.browser.conftest import WINDOW, screenshot
from tests.browser.test_audit_list import squeezed_cells
from tests.conftest import make_agent

pytestmark = pytest.mark.browser

ARGUMENT_TEXTS = {
    "short": "회의록 저장",
    "long-with-spaces": "회의록 저장: 오늘 회의에서 결정된 내용을 정리합니다. " * 30,
    "long-url": "https://wiki.example.com/pages/" + "meeting-notes-2026-12-06-" * 12,
}


def a_pending_approval(text: str) -> Approval:
    agent = make_agent(slug="notes", servers=[], with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="회의록을 저장해줘", status=Run.Status.AWAITING_APPROVAL)
    return Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": text, "notebook_id": "nb-1"},
        call_hash="h" * 64,
        call_id="c1",
        expires_at=timezone.now() + timedelta(hours=1),
    )


def outside(browser: Any, panel: str, selectors: str) -> list[str]:
    """The elements matching ``selectors`` whose box does not lie wholly inside ``panel``'s."""
    return list(
        browser.execute_script(
            """const [panel, selectors] = arguments;
            const box = document.querySelector(panel).getBoundingClientRect();
            return [...document.querySelectorAll(selectors)].filter(e => {
                const r = e.getBoundingClientRect();
                return r.left < box.left - 1 || r.right > box.right + 1;
            }).map(e => e.textContent.trim());""",
            panel,
            selectors,
        )
    )


@pytest.mark.parametrize("language", ["en", "ko"])
@pytest.mark.parametrize("kind", list(ARGUMENT_TEXTS))
def test_the_dashboards_decision_links_stay_inside_the_pending_panel(
    admin_in_browser: Any, kind: str, language: str
) -> None:
    a_pending_approval(ARGUMENT_TEXTS[kind])
    browser = admin_in_browser
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "path": "/"})
    browser.set_window_size(*WINDOW)
    browser.get(f"{browser.base_url}/admin/")
    shown = "#dashboard-approvals :is(.approve-link, .reject-link, td.run a, .args)"
    assert len(browser.find_elements("css selector", shown)) == 4
    cut = outside(browser, "#dashboard-approvals", shown)  # the arguments wrap (the call's page has them whole)
    # ...and only they: the headers, the age, the call's name and the run's slug and id are not broken to fit.
    squeezed = squeezed_cells(browser, "#dashboard-approvals :is(th, td.age, td.call > a, td.run, td.decide)")
    if cut or squeezed:
        screenshot(browser, f"FAILED-dashboard-approvals-{kind}-{language}")
    assert (cut, squeezed) == ([], []), kind


@pytest.mark.parametrize("language", ["en", "ko"])
@pytest.mark.parametrize("kind", list(ARGUMENT_TEXTS))
def test_the_argument_names_stay_whole_beside_a_long_value(admin_in_browser: Any, kind: str, language: str) -> None:
    approval = a_pending_approval(ARGUMENT_TEXTS[kind])
    browser = admin_in_browser
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "path": "/"})
    browser.set_window_size(*WINDOW)
    for page in ("change", "decide/approve", "decide/reject"):
        browser.get(f"{browser.base_url}/admin/agents/approval/{approval.pk}/{page}/")
        names = [cell.text for cell in browser.find_elements("css selector", "table.approval-arg-rows tbody th")]
        assert names == ["notebook_id", "text"] or names == ["text", "notebook_id"], (page, names)
        squeezed = squeezed_cells(browser, "table.approval-arg-rows th")
        if squeezed:
            screenshot(browser, f"FAILED-approval-args-{kind}-{language}-{page.replace('/', '-')}")
        assert squeezed == [], (page, squeezed)
        assert outside(browser, ".approval-main", "table.approval-arg-rows") == [], page  # the value wraps instead
