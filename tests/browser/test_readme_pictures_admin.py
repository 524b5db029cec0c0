"""The README's pictures of the dashboard and of a run's timeline, taken on purpose (not a check):
``PLATFORM_README_PICTURES=1 ./bin/test tests/browser/test_readme_pictures_admin.py`` writes
``docs/screenshots/dashboard.png`` and ``docs/screenshots/run-timeline.png``. Korean text needs a CJK font
where Chromium runs (``apt-get install fonts-nanum``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import Run
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.browser.conftest import screenshot
from tests.conftest import bind_demo_server, discover_as_admin, make_agent

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(os.environ.get("PLATFORM_README_PICTURES") != "1", reason="set PLATFORM_README_PICTURES=1"),
]

PICTURES = Path(settings.BASE_DIR) / "docs" / "screenshots"


def full_page(browser: Any) -> None:
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1440, min(max(height + 40, 900), 2400))


def test_readme_pictures_of_the_dashboard_and_a_run_timeline(
    transactional_db: Any, admin_in_browser: Any, tmp_path: Path
) -> None:
    browser = admin_in_browser
    demo = bind_demo_server()
    assistant = make_agent(slug="company-assistant", servers=[demo])
    react = make_agent(
        slug="team-lookup",
        servers=[demo],
        provider="scripted",
        script=[
            {"tool_calls": [{"name": "list_team_members", "args": {"team": "클라우드운영팀"}}]},
            {"content": "클라우드운영팀 팀원: {last_tool_result}"},
        ],
    )
    for agent, query in (
        (assistant, "김하늘 님은 어느 팀 소속인가요?"),
        (assistant, "노트북 자산 현황 알려줘"),
        (react, "김하늘 님은 어느 팀 소속인가요?"),
    ):
        run_execute(run_id=str(Run.objects.create(agent=agent, query=query).pk))
    timeline_run = Run.objects.filter(agent=react).latest("created_at")
    failing = bind_demo_server(mcp_id="hr-legacy", failure_mode="timeout")
    flaky = make_agent(slug="hr-legacy-agent", servers=[failing])
    for _ in range(3):
        run_execute(run_id=str(Run.objects.create(agent=flaky, query="A-1001 자산 상태 알려줘").pk))
    notes = McpServer.objects.create(
        mcp_id="notes", name="notes", command=sys.executable, args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR), env={"NOTES_FILE": str(tmp_path / "notes.txt")}, session_scope="shared",
    )  # fmt: skip
    assert discover_as_admin(server=notes).ok
    writer = make_agent(
        slug="minutes",
        servers=[notes],
        provider="scripted",
        script=[{"tool_calls": [{"name": "append_note", "args": {"text": "주간 회의록 저장"}}]}, {"content": "저장됨"}],
        with_demo_rules=False,
    )
    run_execute(run_id=str(Run.objects.create(agent=writer, query="회의록을 저장해줘").pk))

    browser.get(f"{browser.base_url}/admin/")
    full_page(browser)
    print(screenshot(browser, "dashboard", PICTURES))
    browser.set_window_size(1440, 900)
    browser.get(f"{browser.base_url}/admin/agents/run/{timeline_run.pk}/change/")
    full_page(browser)
    print(screenshot(browser, "run-timeline", PICTURES))
    browser.set_window_size(1440, 900)
    for mcp_id in ("sds-company-data", "hr-legacy", "notes"):
        get_default_pool().close(mcp_id)
