"""In a real browser, the rule editor saves a rule opened and saved unchanged exactly as stored (values its fields
cannot carry shown as JSON, a regex of several lines in a text area, text areas sent with CRLF), and "only when
this tool is available" follows the chosen server, as the tool choice does."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Agent, DeterministicRule
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from tests.browser.navigation import submit

pytestmark = pytest.mark.browser

WHEN = {
    "any_keywords": ["1,000원", "팀"],
    "all_keywords": [" 팀장"],
    "regex": "(?x) (?P<floor>\\d+)\n 층",
    "context": {"a=b": "x", "k": "x\ny"},
    "data": {"order.id": " 1"},
    "tool_available": "rooms",
}
PARAMS = {"q": "", "note": " x "}


@pytest.fixture
def stored_rule(transactional_db: Any) -> DeterministicRule:
    """A rule as import_config may store it, for an agent binding hr (who_is) and rooms (rooms)."""
    now = timezone.now()
    hr = McpServer.objects.create(mcp_id="hr", name="hr", command=sys.executable, args=[])
    rooms = McpServer.objects.create(mcp_id="rooms", name="rooms", command=sys.executable, args=[])
    McpTool.objects.create(server=hr, name="who_is", input_schema={"type": "object"}, discovered_at=now)
    schema = {"type": "object", "properties": {"q": {"type": "string"}, "note": {"type": "string"}}}
    McpTool.objects.create(server=rooms, name="rooms", input_schema=schema, discovered_at=now)
    agent = Agent.objects.create(slug="desk", name="desk")
    agent.servers.set([hr, rooms])
    return DeterministicRule.objects.create(
        agent=agent, name="방 찾기", server=rooms, tool_name="rooms", when=WHEN, params=PARAMS
    )


def test_a_rule_opened_and_saved_unchanged_is_saved_as_stored(
    admin_in_browser: Any, stored_rule: DeterministicRule
) -> None:
    from selenium.webdriver.common.by import By

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/deterministicrule/{stored_rule.pk}/change/")
    submit(browser, browser.find_element(By.NAME, "_save"))
    assert browser.find_elements(By.CSS_SELECTOR, "ul.messagelist li.success"), browser.find_element(
        By.ID, "content"
    ).text[:2000]
    stored_rule.refresh_from_db()
    assert (stored_rule.when, stored_rule.params) == (WHEN, PARAMS)
    assert not AuditEvent.objects.filter(action="config.deterministic_rule.update").exists()


def test_only_when_a_tool_is_available_follows_the_chosen_server(
    admin_in_browser: Any, stored_rule: DeterministicRule
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/deterministicrule/{stored_rule.pk}/change/")
    available = Select(browser.find_element(By.NAME, "when__tool_available"))

    def offered() -> list[str]:
        return [option.get_attribute("value") or "" for option in available.options]

    assert offered() == ["", "rooms"] and available.first_selected_option.get_attribute("value") == "rooms"
    server = Select(browser.find_element(By.NAME, "server"))
    server.select_by_value(str(McpServer.objects.get(mcp_id="hr").pk))
    assert offered() == ["", "who_is"]
    assert available.first_selected_option.get_attribute("value") == ""  # rooms is no tool of hr
    available.select_by_value("who_is")
    server.select_by_value(str(McpServer.objects.get(mcp_id="rooms").pk))
    assert offered() == ["", "rooms"] and available.first_selected_option.get_attribute("value") == ""
