"""The admin's daily flows in a real browser: a run submitted through the API is followed live on its page to
its answer; a write call is approved from the dashboard's pending list; an auditor filters the audit by a run's
short id, verifies the chain, exports, and fails to change anything."""

from __future__ import annotations

import importlib
import json
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agent_platform.celery import app as celery_app
from agents.execution import run_execute
from agents.models import Agent, Approval, Run
from agents.services import api_key_create
from audit.services import audit_event_record
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.browser.conftest import screenshot
from tests.conftest import AUDITOR_PASSWORD, bind_demo_server, discover_as_admin, make_agent

pytestmark = pytest.mark.browser

WAIT_S = 30
WRITES_A_NOTE = [
    {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
    {"content": "결과: {last_tool_result}"},
]


def wait_for(browser: Any, condition: Callable[[Any], Any], timeout: float = WAIT_S) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # The live page swaps its timeline in as events arrive: an element read a moment ago may be gone.
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(browser, timeout, poll_frequency=0.2, ignored_exceptions=ignored).until(condition)


def css(browser: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, selector)


def in_page_fetch(browser: Any, url: str, method: str = "GET", body: str = "") -> dict[str, Any]:
    """A request from the page itself (the logged-in session's cookies, a CSRF token from the page's form)."""
    return browser.execute_async_script(
        """
        const [url, method, body, done] = arguments;
        const token = (document.querySelector("input[name=csrfmiddlewaretoken]") || {}).value || "";
        const init = {method, credentials: "same-origin", headers: {"X-CSRFToken": token}};
        if (method !== "GET") { init.body = body; init.headers["Content-Type"] = "application/x-www-form-urlencoded"; }
        fetch(url, init).then(r => r.text().then(text => done({status: r.status, text})));
        """,
        url,
        method,
        body,
    )


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def test_a_run_submitted_through_the_api_is_followed_live_to_its_answer(
    transactional_db: Any, admin_in_browser: Any, live_server: Any
) -> None:
    browser = admin_in_browser
    server = bind_demo_server()
    make_agent(slug="company-assistant", servers=[server])
    _key, raw_key = api_key_create(actor="test", via="tests", name="browser caller")
    request = urllib.request.Request(
        f"{live_server.url}/api/v1/runs",
        data=json.dumps({"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}).encode(),
        headers={"Authorization": f"Bearer {raw_key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        assert response.status == 202
        run_id = json.loads(response.read())["id"]
    assert Run.objects.get(pk=run_id).status == Run.Status.QUEUED  # no worker here: it waits

    browser.get(f"{browser.base_url}/admin/agents/run/{run_id}/change/")
    assert css(browser, "#run-live").get_attribute("data-finished") == "false"
    assert "Following the run live" in css(browser, "#run-live").text
    assert css(browser, ".run-cancel-button").is_displayed()

    run_execute(run_id=run_id)  # a worker picks it up; the page hears of it through the event stream

    def settled(b: Any) -> str | None:  # read afresh each time: the page swaps its timeline in as events come
        live = css(b, "#run-live")
        done = live.get_attribute("data-finished") == "true" and not b.find_elements(
            "css selector", ".run-cancel-button"
        )
        return live.text if done and "클라우드운영팀" in live.text else None

    text = wait_for(browser, settled)  # the answer, arrived without a reload
    assert "succeeded" in text and "rule decision" in text and "deterministic call" in text
    assert css(browser, "#run-audit-events").get_attribute("href").endswith(f"/admin/audit/auditevent/?run={run_id}")

    # The list beside the sidebar and the filters: the Korean query wraps between words at a readable width.
    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/agents/run/")
    query = css(browser, "#result_list td.field-short_query")
    assert query.size["width"] >= 150, query.size
    words = ["김하늘", "님은", "어느", "팀", "소속인가요?"]
    assert all(word in words for line in query.text.splitlines() for word in line.split()), query.text  # whole words
    screenshot(browser, "runs_list_1400")
    get_default_pool().close(server.mcp_id)


def test_an_admin_approves_a_write_call_from_the_dashboards_pending_list(
    transactional_db: Any, eager_tasks: None, admin_in_browser: Any, tmp_path: Path
) -> None:
    browser = admin_in_browser
    notes = tmp_path / "notes.txt"
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    agent = make_agent(slug="notes", servers=[server], provider="scripted", script=WRITES_A_NOTE, with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="회의록을 저장해줘")
    run_execute(run_id=str(run.pk))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL

    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/")
    pending = css(browser, "#dashboard-approvals")
    assert "notes.append_note" in pending.text and "회의록 저장" in pending.text
    # The run's link stays inside its panel (a wide table scrolls there instead of running into the next one).
    panel = pending.rect
    for selector in ("td a[href*='/admin/agents/run/']", ".approve-link", ".reject-link"):
        shown = css(browser, f"#dashboard-approvals {selector}").rect  # whole inside the panel, no scrolling
        assert shown["x"] + shown["width"] <= panel["x"] + panel["width"] + 1, (selector, shown, panel)
    screenshot(browser, "dashboard_1400")
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": "ko"})  # the same page in Korean
    browser.get(f"{browser.base_url}/admin/")
    pending = css(browser, "#dashboard-approvals")
    assert "대기 중인 승인" in pending.text
    for selector in (".approve-link", ".reject-link"):
        shown, panel = css(browser, f"#dashboard-approvals {selector}").rect, pending.rect
        assert shown["x"] + shown["width"] <= panel["x"] + panel["width"] + 1, (selector, shown, panel)
    screenshot(browser, "dashboard_1400_ko")
    browser.delete_cookie(settings.LANGUAGE_COOKIE_NAME)
    browser.get(f"{browser.base_url}/admin/")
    css(browser, "#dashboard-approvals .approve-link").click()
    assert "회의록 저장" in css(browser, ".approval-args").text  # the arguments, shown before deciding
    css(browser, "#confirm-decision").click()

    wait_for(browser, lambda b: f"/admin/agents/run/{run.pk}/change/" in b.current_url)
    wait_for(
        browser,
        lambda b: (
            css(b, "#run-live").get_attribute("data-finished") == "true" and "notes: 1" in css(b, "#run-live").text
        ),
    )
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by) == ("executed", "admin:admin")
    assert len(notes.read_text(encoding="utf-8").splitlines()) == 1
    browser.get(f"{browser.base_url}/admin/")
    assert "Nothing waits for a decision." in css(browser, "#dashboard-approvals").text
    get_default_pool().close("notes")


@pytest.fixture
def auditor_group(transactional_db: Any) -> None:
    """The ``auditor`` group as its migration makes it: a transactional test's flush removed it (and
    ``serialized_rollback`` collides with the content types the flush re-creates)."""
    from django.contrib.auth.models import Group, Permission

    migration = importlib.import_module("audit.migrations.0005_auditor_group")
    group, _created = Group.objects.get_or_create(name=migration.AUDITOR_GROUP)
    group.permissions.set(
        Permission.objects.get(content_type__app_label=app, content_type__model=model, codename=codename)
        for app, model, codename in migration.AUDITOR_PERMISSIONS
    )


def test_an_auditor_filters_by_a_short_run_id_verifies_exports_and_cannot_change_anything(
    live_server: Any, auditor_group: None, auditor_user: Any, log_in: Callable[[str, str], Any]
) -> None:
    agent = Agent.objects.create(slug="ledger", name="장부")
    runs = [Run.objects.create(agent=agent, query=q) for q in ("첫째", "둘째")]
    for run in runs:
        audit_event_record(
            source="agent", run_id=run.pk, mcp_id="m", tool="lookup", ok=True, attempt=1, latency_ms=4, actor="local"
        )
    approval = Approval.objects.create(
        run=runs[0], mcp_id="m", tool="write", args={"x": 1}, call_hash="h" * 64, call_id="c",
        expires_at=runs[0].created_at.replace(year=runs[0].created_at.year + 1),
    )  # fmt: skip
    browser = log_in("audrey", AUDITOR_PASSWORD)

    browser.get(f"{browser.base_url}/admin/audit/auditevent/")
    short = str(runs[0].pk)[:8]
    assert short in css(browser, "#result_list").text
    field = css(browser, "input[name=run]")
    field.send_keys(short)
    field.submit()
    # The list once the filtered page has loaded (the URL changes before the new page is there).
    rows = wait_for(
        browser,
        lambda b: (
            (f"run={short}" in b.current_url and len(b.find_elements("css selector", "#result_list tbody tr")) == 1)
            and b.find_elements("css selector", "#result_list tbody tr")
        ),
    )
    assert short in rows[0].text

    export = css(browser, ".object-tools a[href*='format=jsonl']").get_attribute("href")
    assert f"run={short}" in export
    exported = in_page_fetch(browser, export)
    assert exported["status"] == 200
    assert [json.loads(line)["run"] for line in exported["text"].splitlines()] == [str(runs[0].pk)]

    css(browser, "#verify-chain-button").click()
    wait_for(browser, lambda b: b.find_elements("css selector", "#chain-verdict"))
    assert "The audit chain is intact." in css(browser, "#chain-verdict").text

    event_id = runs[0].pk
    for url, body in (
        ("/admin/audit/auditevent/", "action=delete_selected&_selected_action=1"),
        (f"/admin/agents/run/{event_id}/cancel/", ""),
        (f"/admin/agents/approval/{approval.pk}/decide/approve/", "reason=ok"),
        ("/admin/agents/approval/", f"action=approve&_selected_action={approval.pk}"),
        ("/api/v1/audit/events", ""),
    ):
        assert in_page_fetch(browser, url, "POST", body)["status"] == 403, url
    browser.get(f"{browser.base_url}/admin/agents/approval/{approval.pk}/change/")
    assert browser.find_elements("css selector", "#approve-button") == []
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
