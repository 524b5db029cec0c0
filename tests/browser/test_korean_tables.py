"""The demo's admin pages in Korean, at 1,400 px beside the menu: no table column is narrower than its longest
word (the Korean pages let words break anywhere, so headers went 사/용 and tool names classify_reque/st)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer
from tests.browser.conftest import screenshot
from tests.browser.test_audit_list import squeezed_cells

pytestmark = pytest.mark.browser


def test_the_demos_tables_keep_their_words_whole_in_korean(admin_in_browser: Any) -> None:
    call_command("seed_demo", stdout=io.StringIO(), stderr=io.StringIO())
    server = McpServer.objects.get(mcp_id="sds-company-data")
    agent = Agent.objects.get(slug="company-assistant")
    rule = DeterministicRule.objects.filter(agent=agent).first()
    browser = admin_in_browser
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": "ko", "path": "/"})
    browser.set_window_size(1400, 900)
    try:
        for name, url in [
            ("servers", "/admin/mcpregistry/mcpserver/"),
            ("server", f"/admin/mcpregistry/mcpserver/{server.pk}/change/"),
            ("tools", "/admin/mcpregistry/mcptool/"),
            ("agent", f"/admin/agents/agent/{agent.pk}/change/"),
            ("rules", "/admin/agents/deterministicrule/"),
            ("rule", f"/admin/agents/deterministicrule/{rule.pk}/change/"),
            ("keys", "/admin/agents/apikey/"),
        ]:
            browser.get(f"{browser.base_url}{url}")
            assert browser.find_element("css selector", "html").get_attribute("lang") == "ko"
            squeezed = squeezed_cells(browser, "table td, table th")
            if squeezed:
                height = browser.execute_script("return document.documentElement.scrollHeight")
                browser.set_window_size(1400, min(height + 40, 3000))
                screenshot(browser, f"FAILED-korean-table-{name}")
                browser.set_window_size(1400, 900)
            assert squeezed == [], (name, squeezed)
    finally:
        browser.set_window_size(1440, 900)
