"""An admin creates a rule with the rule editor (server and tool chosen, conditions as fields, a params field
per argument filled from the offered placeholders) and dry-runs it in the rule tester."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent, DeterministicRule
from tests.browser.conftest import screenshot
from tests.browser.navigation import submit
from tests.conftest import bind_demo_server

pytestmark = pytest.mark.browser


@pytest.fixture
def demo_agent_without_rules(transactional_db: Any) -> Agent:
    server = bind_demo_server(mcp_id="sds-company-data")
    agent = Agent.objects.create(slug="helper", name="Helper")
    agent.servers.set([server])
    return agent


def test_an_admin_creates_a_rule_in_the_editor_and_dry_runs_it(admin_in_browser: Any, demo_agent_without_rules) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser = admin_in_browser
    agent = demo_agent_without_rules
    browser.get(f"{browser.base_url}/admin/agents/deterministicrule/add/")
    Select(browser.find_element(By.NAME, "agent")).select_by_value(str(agent.pk))
    browser.find_element(By.NAME, "name").send_keys("employee team")
    order = browser.find_element(By.NAME, "order")
    order.clear()
    order.send_keys("10")
    Select(browser.find_element(By.NAME, "server")).select_by_visible_text("sds-company-data")
    Select(browser.find_element(By.NAME, "tool_name")).select_by_value("search_employee")

    # The params rows follow the tool: one field per argument.
    param = browser.find_element(By.NAME, "params__value__name")

    browser.find_element(By.NAME, "when__any_keywords").send_keys("team, 소속")
    regex = browser.find_element(By.NAME, "when__regex")
    check = browser.find_element(By.CSS_SELECTOR, ".regex-check")

    def check_shows(text: str, verdict: str) -> None:
        """Typed into the emptied field, ``text`` is given ``verdict`` (its start) once the server has answered."""
        regex.clear()
        regex.send_keys(text)
        try:
            WebDriverWait(browser, 10).until(lambda _b: check.text.startswith(verdict))
        except TimeoutException:
            raise AssertionError(f"{text!r}: {check.text!r}, not {verdict!r}") from None

    # Checked as it is typed, by the server as on save: Python's regular expressions, not JavaScript's RegExp (which
    # refused inline flags and \Z, and took (?<name>…), which the server refuses).
    check_shows("(?P<name>[가-힣]{2,4}", "✗ not a valid regular expression: a ( is not closed with ) (at character 1)")
    check_shows(r"(?i)^A-\d{4}\Z", "✓ a valid regular expression")
    check_shows("(?<name>[가-힣]{2,4})", "✗ not a valid regular expression: a named group is written (?P<name>…)")
    check_shows(r"(?P<name>[가-힣]{2,4})\s*님", "✓ a valid regular expression; its groups: name")

    # The placeholders offered follow the conditions; a click inserts one into the focused field.
    param.click()
    browser.find_element(By.CSS_SELECTOR, "button[data-placeholder='{match.name}']").click()
    assert param.get_attribute("value") == "{match.name}"
    submit(browser, browser.find_element(By.NAME, "_save"))
    assert browser.find_elements(By.CSS_SELECTOR, "ul.messagelist li.success"), browser.find_element(
        By.ID, "content"
    ).text[:2000]
    rule = DeterministicRule.objects.get(name="employee team")
    assert rule.when == {"any_keywords": ["team", "소속"], "regex": r"(?P<name>[가-힣]{2,4})\s*님"}
    assert rule.params == {"name": "{match.name}"} and rule.tool_name == "search_employee"

    # The rule tester dry-runs it: matched, with the rendered params and the contract's verdict; nothing called.
    browser.get(f"{browser.base_url}/admin/agents/rule-tester/")
    Select(browser.find_element(By.NAME, "agent")).select_by_value(str(agent.pk))
    browser.find_element(By.NAME, "query").send_keys("김하늘 님은 어느 팀 소속인가요?")
    submit(browser, (By.CSS_SELECTOR, "input[type=submit]"))
    row = browser.find_element(By.XPATH, "//tr[td[contains(., 'employee team')]]").text
    assert "matched" in row and "김하늘" in row and "sds-company-data.search_employee" in row

    # Asked to call it, through the gate: the outcome in words, the value and the whole result (JSON) a click
    # away; the rule's name on one line.
    browser.find_element(By.NAME, "execute").click()
    submit(browser, (By.CSS_SELECTOR, "input[type=submit]"))
    cell = browser.find_element(By.XPATH, "//tr[td[contains(., 'employee team')]]/td[2]")
    assert cell.size["width"] >= 100, cell.size  # not one character per line
    row_element = browser.find_element(By.XPATH, "//tr[td[contains(., 'employee team')]]")
    assert "succeeded · 1 attempt" in row_element.text and "클라우드운영팀" not in row_element.text  # folded
    row_element.find_element(By.CSS_SELECTOR, ".tester-value summary").click()
    row_element.find_element(By.CSS_SELECTOR, ".tester-result summary").click()
    row = row_element.text
    assert '"ok": true' in row and "클라우드운영팀" in row and "True" not in row
    screenshot(browser, "rule_tester_executed")
