"""A run's page follows every kind of event its timeline draws (review defect: the page listened for some kinds
only, so a flow's node without a tool call never showed while the run went on); and a resumed flow's page, with
its approval beside the call it let through, as a reader sees it (a screenshot, ``flow_run_with_approval``)."""

from __future__ import annotations

from typing import Any

import pytest

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.run_state import RunEventWriter
from tests.agents.test_flow_writes import flow_run  # noqa: F401
from tests.browser.conftest import screenshot
from tests.browser.test_admin_workspace import css, wait_for

pytestmark = pytest.mark.browser


@pytest.mark.parametrize(
    ("kind", "data", "shown"),
    [
        ("flow_node", {"node": "팀_조회", "updated": ["team"]}, "팀_조회"),
        ("tool_selection", {"turn": 1, "ranker": "none", "offered": [{"name": "조직도", "why": "pinned"}]}, "조직도"),
        ("parallel_calls", {"calls": [{"call_id": "c1", "tool": "동시_조회"}], "max_overlap": 1}, "동시_조회"),
    ],
)
def test_an_event_of_a_kind_the_timeline_draws_refreshes_the_live_page(
    transactional_db: Any, admin_in_browser: Any, settings: Any, kind: str, data: dict[str, Any], shown: str
) -> None:
    settings.PLATFORM_SSE_POLL_S = 0.2
    agent = Agent.objects.create(slug="live-flow", name="흐름")
    run = Run.objects.create(agent=agent, query="팀을 알려줘", status=Run.Status.RUNNING)
    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/run/{run.pk}/change/")
    assert css(browser, "#run-live").get_attribute("data-finished") == "false"
    assert shown not in css(browser, "#run-timeline").text

    # The run's only event, and nothing follows it: only this event can bring its step in.
    writer = RunEventWriter(run_id=run.pk, secrets=[])
    writer.emit(kind, data)
    try:
        wait_for(browser, lambda b: shown in css(b, "#run-timeline").text, timeout=15)
    finally:  # the run ends and the page goes, so that no stream outlives the test
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, answer="끝")
        writer.emit("status", {"status": "succeeded", "answer": "끝", "error": None})
        browser.get("about:blank")


def test_a_resumed_flows_page_shows_its_approval_by_its_call(
    transactional_db: Any,
    flow_run: Any,  # noqa: F811
    admin_in_browser: Any,
) -> None:
    run, _file = flow_run
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))
    browser = admin_in_browser
    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/agents/run/{run.pk}/change/")
    steps = browser.find_elements("css selector", "#run-timeline > li")
    kinds = [s.get_attribute("class").split()[1] for s in steps]
    assert kinds == [
        "step-message", "step-flow", "step-approval", "step-flow", "step-pass", "step-flow", "step-flow", "step-flow",
        "step-answer",
    ], kinds  # fmt: skip
    link = css(browser, "#run-timeline .step-approval .step-approval-link")
    assert link.get_attribute("href").endswith(f"/admin/agents/approval/{approval.pk}/change/")
    path = screenshot(browser, "flow_run_with_approval")
    print(f"\nscreenshot of a resumed flow's page: {path}")
