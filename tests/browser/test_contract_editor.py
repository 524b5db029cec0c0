"""An admin edits a tool contract with the structured editor: a refused negative timeout and a refused
self-fallback, each with its error at its field, then a change that is saved.

With ``PLATFORM_README_PICTURES=1`` it also saves the README's picture of the editor,
``docs/screenshots/contract-editor.png``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from mcpregistry.models import McpServer, ToolContract
from tests.browser.conftest import WINDOW, screenshot
from tests.browser.navigation import submit
from tests.conftest import bind_demo_server

pytestmark = pytest.mark.browser


@pytest.fixture
def demo_binding(transactional_db: Any) -> McpServer:
    return bind_demo_server(mcp_id="sds-company-data")


def field_errors(browser: Any, field: str) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, f".field-{field} .errorlist").text


def test_an_admin_edits_a_contract_with_the_structured_editor(admin_in_browser: Any, demo_binding) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    tool = demo_binding.tools.get(name="get_asset_status")
    browser.get(f"{browser.base_url}/admin/mcpregistry/mcptool/{tool.pk}/change/")

    # One row per argument of the input schema; the fallback offers the backup tool, never the tool itself.
    assert browser.find_element(By.ID, "contract-0-args-row-asset_id").is_displayed()
    fallback = Select(browser.find_element(By.NAME, "contract-0-fallback_tool"))
    offered = [o.get_attribute("value") for o in fallback.options]
    assert "get_asset_status_backup" in offered and "get_asset_status" not in offered

    # A negative timeout is refused, at the timeout field.
    timeout = browser.find_element(By.NAME, "contract-0-timeout_s")
    timeout.clear()
    timeout.send_keys("-1")
    submit(browser, browser.find_element(By.NAME, "_continue"))
    assert "more than 0 and at most 3600 seconds" in field_errors(browser, "timeout_s")

    # A self-fallback typed into the JSON view is refused, at the fallback field.
    timeout = browser.find_element(By.NAME, "contract-0-timeout_s")
    timeout.clear()
    timeout.send_keys("5")
    browser.find_element(By.XPATH, "//summary[contains(., 'the contract as JSON')]").click()
    document = json.loads(browser.find_element(By.NAME, "contract-0-contract_json").get_attribute("value"))
    document["fallback"] = "get_asset_status"
    browser.execute_script(
        "document.getElementsByName('contract-0-contract_json')[0].value = arguments[0];", json.dumps(document)
    )
    submit(browser, browser.find_element(By.NAME, "_continue"))
    assert "cannot be its own fallback" in field_errors(browser, "fallback_tool")

    # A valid change through the fields is saved.
    browser.get(f"{browser.base_url}/admin/mcpregistry/mcptool/{tool.pk}/change/")
    browser.find_element(By.NAME, "contract-0-args__0__pattern").send_keys(r"^A-\d{4}$")
    browser.find_element(By.NAME, "contract-0-args__0__max_length").send_keys("6")
    retry_on_transport = browser.find_element(By.CSS_SELECTOR, "input[name='contract-0-retry__on'][value='transport']")
    retry_on_transport.click()
    timeout = browser.find_element(By.NAME, "contract-0-timeout_s")
    timeout.clear()
    timeout.send_keys("3")
    submit(browser, browser.find_element(By.NAME, "_continue"))
    assert browser.find_elements(By.CSS_SELECTOR, "ul.messagelist li.success")
    contract = ToolContract.objects.get(tool=tool)
    assert contract.args["asset_id"]["pattern"] == r"^A-\d{4}$" and contract.args["asset_id"]["max_length"] == 6
    assert contract.retry["on"] == ["rate_limit", "timeout"] and contract.timeout_s == 3.0

    if os.environ.get("PLATFORM_README_PICTURES") == "1":
        readme_picture(browser)


def readme_picture(browser: Any) -> None:
    """The README's picture of the contract editor: the contract part of the tool's page."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(WINDOW[0], 1250)
    try:
        browser.execute_script("document.getElementById('nav-sidebar')?.remove();")
        browser.execute_script("arguments[0].scrollIntoView();", browser.find_element(By.ID, "contract-group"))
        screenshot(browser, "contract-editor", Path(settings.BASE_DIR) / "docs" / "screenshots")
    finally:
        browser.set_window_size(*WINDOW)


@pytest.mark.parametrize("language", ["ko", "en"])
def test_the_argument_table_reads_at_1400_px(admin_in_browser: Any, demo_binding: McpServer, language: str) -> None:
    """Each argument's name and description keep a readable width beside the menu (in Korean the name went down
    one letter a line), the headers stay whole, and no row of the editor is pushed past its box."""
    from selenium.webdriver.common.by import By

    from tests.browser.test_versions_pages import in_language

    tool = demo_binding.tools.get(name="list_team_members")
    browser = admin_in_browser
    in_language(browser, language)
    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/mcpregistry/mcptool/{tool.pk}/change/")
    table = browser.find_element(By.CSS_SELECTOR, "table.contract-args")
    browser.execute_script("arguments[0].scrollIntoView()", table)
    screenshot(browser, f"contract-arguments-{language}")
    name_cell = table.find_element(By.CSS_SELECTOR, "tbody td")
    assert name_cell.size["width"] >= 120
    assert name_cell.find_element(By.TAG_NAME, "code").size["height"] < 30  # the name on one line
    headers = browser.execute_script(
        "return [...arguments[0].querySelectorAll('th')].map(th => th.getClientRects()[0].height)", table
    )
    assert max(headers) < 30
    pushed = browser.execute_script(
        "return [...document.querySelectorAll('.form-row')].filter(r => r.scrollWidth > r.clientWidth + 1).length"
    )
    assert pushed == 0
