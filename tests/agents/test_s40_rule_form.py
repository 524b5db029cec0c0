"""The rule editor's save of a page loaded before another save, a rule entry pasted alone into a new rule's JSON,
the placeholders offered for conditions written as JSON, and the conditions' errors worded as the page labels
its inputs.

1. Two tabs: A changed the keywords and saved; B, loaded before, changed the order and saved, and both said saved:
   B's untouched JSON view (compared with the rule as stored when B posted) wrote A's old keywords back and B's
   own order was lost. Now the JSON view is compared with what B was shown, and B's save is refused, naming
   what changed.
2. An ``export_config`` rule entry pasted alone into a new rule's JSON view was refused ("name: This field is
   required"), its panel folded shut.
3. Context or data typed as JSON offered ``{context.{"사용자": …}}``; a line without ``=`` offered itself.
4. The conditions' errors named JSON keys (``context, line 1: write KEY=value``), data's syntax wrong, JSON
   unmentioned, and every input of the conditions outlined.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.configuration import config_export
from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.agents.test_rule_form_roundtrip import as_browser_posts, errors
from tests.browser.conftest import (  # noqa: F401  (the browser's fixtures, for the browser test below)
    admin_in_browser,
    browser,
    chromium,
    log_in,
    screenshot,
)
from tests.browser.navigation import submit

ADD = "/admin/agents/deterministicrule/add/"


def ledger_agent() -> Agent:
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "limit": {"type": "integer"}}}
    tool = McpTool.objects.create(server=server, name="lookup", input_schema=schema, discovered_at=timezone.now())
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}, "limit": {"type": "int"}})
    agent = Agent.objects.create(slug="ledger", name="ledger")
    agent.servers.set([server])
    return agent


@pytest.fixture
def ledger(db: Any) -> Agent:
    return ledger_agent()


def stored_rule(agent: Agent) -> DeterministicRule:
    return DeterministicRule.objects.create(
        agent=agent,
        name="이름 조회",
        order=10,
        server=agent.servers.get(),
        tool_name="lookup",
        when={"any_keywords": ["소속", "팀"]},
        params={"name": "{query}"},
    )


def change_url(rule: DeterministicRule) -> str:
    return f"/admin/agents/deterministicrule/{rule.pk}/change/"


def test_a_page_loaded_before_another_save_is_refused_naming_what_changed(admin_client: Client, ledger) -> None:
    rule = stored_rule(ledger)
    tab_a = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    tab_b = as_browser_posts(admin_client.get(change_url(rule)).content.decode())

    saved = admin_client.post(change_url(rule), {**tab_a, "when__any_keywords": "부서"})
    assert saved.status_code == 302, errors(saved.content.decode())
    refused = admin_client.post(change_url(rule), {**tab_b, "order": "5"})

    assert refused.status_code == 200
    said = errors(refused.content.decode())
    assert (
        "This rule was saved elsewhere after this page was loaded (changed: Conditions (any of these keywords))" in said
    )
    rule.refresh_from_db()
    assert (rule.when, rule.order) == ({"any_keywords": ["부서"]}, 10)  # A's save stands
    # Refused again until the page is loaded again: what the page was shown travels with it.
    again = as_browser_posts(refused.content.decode())
    assert admin_client.post(change_url(rule), again).status_code == 200
    # Loaded again, B's change is saved over A's, A's kept.
    tab_b = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    assert admin_client.post(change_url(rule), {**tab_b, "order": "5"}).status_code == 302
    rule.refresh_from_db()
    assert (rule.when, rule.order) == ({"any_keywords": ["부서"]}, 5)


def test_a_refusal_names_the_changed_settings_in_the_readers_language(admin_client: Client, ledger) -> None:
    rule = stored_rule(ledger)
    page = admin_client.get(change_url(rule), HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    DeterministicRule.objects.filter(pk=rule.pk).update(name="다른 이름", when={"any_keywords": ["부서"]})
    refused = admin_client.post(change_url(rule), as_browser_posts(page), HTTP_ACCEPT_LANGUAGE="ko")
    said = errors(refused.content.decode())
    assert "이름" in said and "다음 키워드 중 하나 이상 포함" in said, said  # name; any of these keywords
    assert DeterministicRule.objects.get(pk=rule.pk).name == "다른 이름"


@pytest.mark.slow
def test_an_edited_json_view_is_still_what_is_saved(admin_client: Client, ledger: Agent) -> None:
    rule = stored_rule(ledger)
    posted = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    entry = {**json.loads(posted["rule_json"][0]), "order": 7, "when": {"all_keywords": ["팀"]}}
    response = admin_client.post(change_url(rule), {**posted, "rule_json": json.dumps(entry, ensure_ascii=False)})
    assert response.status_code == 302, errors(response.content.decode())
    assert config_export()["rules"] == [entry]


def export_entry(agent: Agent) -> dict[str, Any]:
    """A complete ``export_config`` rule entry, as an admin copies it from another installation."""
    rule = stored_rule(agent)
    [entry] = config_export()["rules"]
    rule.delete()
    return {**entry, "name": "붙여 넣은 규칙", "when": {"any_keywords": ["부서"]}}


def test_a_rule_entry_pasted_alone_into_a_new_rules_json_is_saved(admin_client: Client, ledger: Agent) -> None:
    entry = export_entry(ledger)
    page = as_browser_posts(admin_client.get(ADD).content.decode())  # every other field left as the page has it
    assert page["name"] == [""] and page["tool_name"] == [""]
    response = admin_client.post(ADD, {**page, "rule_json": json.dumps(entry, ensure_ascii=False)})
    assert response.status_code == 302, errors(response.content.decode())
    assert config_export()["rules"] == [entry]


def test_a_rule_entry_posted_alone_is_saved(admin_client: Client, ledger: Agent) -> None:
    entry = export_entry(ledger)
    response = admin_client.post(ADD, {"rule_json": json.dumps(entry, ensure_ascii=False)})
    assert response.status_code == 302, errors(response.content.decode())
    assert config_export()["rules"] == [entry]


def test_a_pasted_entry_with_a_problem_is_refused_at_the_json_view(admin_client: Client, ledger: Agent) -> None:
    entry = {**export_entry(ledger), "tool": "erase"}
    page = as_browser_posts(admin_client.get(ADD).content.decode())
    response = admin_client.post(ADD, {**page, "rule_json": json.dumps(entry, ensure_ascii=False)})
    said = errors(response.content.decode())
    assert "is not an enabled tool of Ledger-Data" in said and "This field is required" not in said, said
    assert not DeterministicRule.objects.exists()


def rule_post(agent: Agent, **changes: str) -> dict[str, Any]:
    return {
        "agent": str(agent.pk),
        "name": "이름 조회",
        "order": "10",
        "enabled": "on",
        "server": str(agent.servers.get().pk),
        "tool_name": "lookup",
        "when__editor": "1",
        "when__any_keywords": "소속",
        "when__regex": "",
        "when__context": "",
        "when__data": "",
        "when__tool_available": "",
        "params__editor": "1",
        "params__names": ["name"],
        "params__value__name": "{query}",
        **changes,
    }


def outlined(page: str) -> list[str]:
    """The conditions' inputs marked as holding the error."""
    import re

    return re.findall(r'name="when__(\w+)" aria-invalid="true"', page)


def test_the_conditions_errors_name_the_labels_and_the_syntax_and_outline_only_their_inputs(
    admin_client: Client, ledger: Agent
) -> None:
    changes = {"when__context": "등급 골드", "when__data": "order.id", "when__regex": "(?P<name>[가-힣"}
    page = admin_client.post(ADD, rule_post(ledger, **changes)).content.decode()
    said = errors(page)
    assert "context equals, line 1: write KEY=value lines, or a JSON object." in said, said
    assert "A2A data, line 1: write PATH=value lines (PATH=* for present), or a JSON object." in said
    assert "regex: not a valid regular expression" in said
    assert "context," not in said.replace("context equals,", "") and "KEY=value." not in said
    assert sorted(outlined(page)) == ["context", "data", "regex"]

    page = admin_client.post(ADD, rule_post(ledger, when__data='{"order": 1')).content.decode()
    assert "A2A data: write PATH=value lines, or a JSON object." in errors(page)
    assert outlined(page) == ["data"]
    # The model's checks of a part (its regex, on a form whose other parts read) are worded the same way.
    page = admin_client.post(ADD, rule_post(ledger, when__regex="(?<name>x)")).content.decode()
    assert "regex: not a valid regular expression" in errors(page) and outlined(page) == ["regex"]


def test_the_conditions_errors_are_in_the_readers_language(admin_client: Client, ledger: Agent) -> None:
    changes = {"when__data": "order.id", "when__any_keywords": '["팀"'}
    page = admin_client.post(ADD, rule_post(ledger, **changes), HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    said = errors(page)
    assert "A2A 데이터, " in said and "다음 키워드 중 하나 이상 포함: " in said, said
    assert "data, " not in said and "any_keywords" not in said


@pytest.mark.browser
@pytest.mark.slow
def test_in_a_browser_json_conditions_offer_their_keys_and_a_refused_json_stays_open(
    admin_in_browser: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    from selenium.webdriver.common.by import By

    driver = admin_in_browser
    agent = ledger_agent()
    driver.get(f"{driver.base_url}{ADD}")

    def chips() -> list[str]:
        return [b.text for b in driver.find_elements(By.CSS_SELECTOR, ".placeholder-chips button")]

    context = driver.find_element(By.NAME, "when__context")
    data = driver.find_element(By.NAME, "when__data")
    context.send_keys('{"사용자": "김하늘", "채널": 1234}')
    data.send_keys('{"order": {"id": "*", "lines": {}}, "tier": "gold"}')
    assert chips() == [
        "{query}",
        "{context.사용자}",
        "{context.채널}",
        "{data.order.id}",
        "{data.order.lines}",
        "{data.tier}",
    ]
    context.clear()
    context.send_keys('등급 골드\nchatbotId=premium\n{"x": ')
    data.clear()
    data.send_keys('{"order": ')  # not read yet: no key offered
    assert chips() == ["{query}", "{context.chatbotId}"]

    # A pasted entry refused for its tool: the JSON view it is in stays open, holding it.
    driver.get(f"{driver.base_url}{ADD}")
    entry = {"agent": agent.slug, "name": "붙여 넣은 규칙", "mcp_id": "Ledger-Data", "tool": "nope"}
    driver.find_element(By.XPATH, "//textarea[@name='rule_json']/ancestor::details/summary").click()
    area = driver.find_element(By.NAME, "rule_json")
    driver.execute_script("arguments[0].value = arguments[1];", area, json.dumps(entry, ensure_ascii=False))
    submit(driver, driver.find_element(By.NAME, "_save"))
    assert "is not an enabled tool" in driver.find_element(By.CSS_SELECTOR, ".field-tool_name .errorlist").text
    area = driver.find_element(By.NAME, "rule_json")
    assert driver.execute_script("return arguments[0].closest('details').open", area)
    assert json.loads(area.get_attribute("value")) == entry
    screenshot(driver, "s40_rule_json_kept_open")

    # The conditions' errors: only the failing input is outlined.
    driver.get(f"{driver.base_url}{ADD}")
    driver.find_element(By.NAME, "when__context").send_keys("등급 골드")
    driver.find_element(By.NAME, "when__any_keywords").send_keys("소속")
    submit(driver, driver.find_element(By.NAME, "_save"))

    def border(name: str) -> str:
        return driver.find_element(By.NAME, name).value_of_css_property("border-top-color")

    assert border("when__context") != border("when__any_keywords")
    assert border("when__any_keywords") == border("when__data")
    assert "context equals, line 1" in driver.find_element(By.CSS_SELECTOR, ".field-when .errorlist").text
    assert not DeterministicRule.objects.exists()
