"""An admin adds the demo MCP server over stdio and discovers its tools from the server's own page."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from django.conf import settings

from tests.browser.navigation import submit

pytestmark = pytest.mark.browser


def test_an_admin_adds_a_stdio_server_and_discovers_it_from_its_page(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/mcpregistry/mcpserver/add/")
    browser.find_element(By.NAME, "mcp_id").send_keys("Demo-Company")
    browser.find_element(By.NAME, "name").send_keys("Demo company data")
    Select(browser.find_element(By.NAME, "transport")).select_by_value("stdio")
    browser.find_element(By.NAME, "command").send_keys(sys.executable)
    args = browser.find_element(By.NAME, "args")
    args.clear()
    args.send_keys(json.dumps(["-m", settings.PLATFORM_DEMO_SERVER_MODULE]))
    browser.find_element(By.NAME, "cwd").send_keys(str(settings.BASE_DIR))
    browser.find_element(By.NAME, "env_settings").send_keys("FAILURE_MODE=none")
    submit(browser, browser.find_element(By.NAME, "_save"))

    # The new binding's page follows, with its next step offered.
    messages = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "Added Demo-Company." in messages
    assert "FAILURE_MODE=none" in browser.find_element(By.NAME, "env_settings").get_attribute("value")
    submit(browser, browser.find_element(By.ID, "discover-tools"))

    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li.success").text
    assert message.startswith("Discovery of Demo-Company: 7 tools listed; added: ")
    assert "search_employee" in message
    tools = browser.find_element(By.ID, "tools-group").text
    assert "search_employee" in tools and "get_asset_status_backup" in tools

    submit(browser, browser.find_element(By.ID, "check-health"))
    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li.success").text
    assert message.startswith("Health of Demo-Company: ok, 7 tools listed")


def test_a_servers_page_shows_only_what_its_transport_uses(admin_in_browser: Any) -> None:
    """Local tools have no process, URL or secrets: their page shows their dotted paths; choosing another
    transport shows its own fields (a hidden field keeps its value)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from agents.management.commands.seed_demo import seed_local_tools

    server = seed_local_tools()
    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/mcpregistry/mcpserver/{server.pk}/change/")

    def shown() -> set[str]:
        names = ("command", "args", "cwd", "url", "env_settings", "new_env", "new_headers", "clear_secrets")
        return {name for name in names if browser.find_element(By.NAME, name).is_displayed()}

    assert shown() == {"args"}
    assert "mcpregistry.builtin_tools" in browser.find_element(By.NAME, "args").get_attribute("value")
    transport = Select(browser.find_element(By.NAME, "transport"))
    transport.select_by_value("streamable_http")
    assert shown() == {"url", "new_headers", "clear_secrets"}
    transport.select_by_value("stdio")
    assert shown() == {"command", "args", "cwd", "env_settings", "new_env", "clear_secrets"}
    transport.select_by_value("local")
    assert shown() == {"args"}


def test_a_field_the_transport_does_not_use_is_shown_when_it_has_an_error_to_fix(admin_in_browser: Any) -> None:
    """A stdio command left with a refused placeholder, then the transport switched to HTTP: the save is refused
    for the command, and the command is on the page with its error (not hidden with nothing to fix)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/mcpregistry/mcpserver/add/")
    browser.find_element(By.NAME, "mcp_id").send_keys("remote")
    browser.find_element(By.NAME, "name").send_keys("Remote")
    browser.find_element(By.NAME, "command").send_keys("${HOME}/bin/server")
    Select(browser.find_element(By.NAME, "transport")).select_by_value("streamable_http")
    assert not browser.find_element(By.NAME, "command").is_displayed()
    browser.find_element(By.NAME, "url").send_keys("https://mcp.example.com/mcp")
    submit(browser, browser.find_element(By.NAME, "_save"))

    command = browser.find_element(By.NAME, "command")
    assert command.is_displayed() and command.get_attribute("value") == "${HOME}/bin/server"
    row = browser.find_element(By.CSS_SELECTOR, ".form-row.field-command")
    assert "${VAR}" in row.find_element(By.CSS_SELECTOR, ".errorlist").text
    assert browser.find_element(By.NAME, "url").is_displayed()


def test_an_admin_sets_and_removes_a_secret_as_lines_and_never_sees_it_again(admin_in_browser: Any) -> None:
    """Secrets are typed as NAME=value lines and cleared by ticking their name: no JSON on the page, and the
    value typed never comes back."""
    from selenium.webdriver.common.by import By

    from tests.conftest import bind_demo_server

    server = bind_demo_server()
    browser = admin_in_browser
    page = f"{browser.base_url}/admin/mcpregistry/mcpserver/{server.pk}/change/"
    browser.get(page)
    browser.find_element(By.NAME, "new_env").send_keys("EXTRA_TOKEN=tok-extra-9876543210")
    submit(browser, browser.find_element(By.NAME, "_continue"))
    stored = browser.find_element(By.CSS_SELECTOR, ".field-secrets_state .readonly").text
    assert "environment EXTRA_TOKEN: set" in stored and "environment INTERNAL_API_KEY: set" in stored
    assert "tok-extra-9876543210" not in browser.page_source
    assert browser.find_element(By.NAME, "new_env").get_attribute("value") == ""

    box = browser.find_element(By.CSS_SELECTOR, "input[name=remove_secrets][value='env:EXTRA_TOKEN']")
    label = browser.find_element(By.CSS_SELECTOR, f"label[for='{box.get_attribute('id')}']").text
    assert label == "environment EXTRA_TOKEN"
    box.click()
    submit(browser, browser.find_element(By.NAME, "_continue"))
    stored = browser.find_element(By.CSS_SELECTOR, ".field-secrets_state .readonly").text
    assert "EXTRA_TOKEN" not in stored and "environment INTERNAL_API_KEY: set" in stored
    server.refresh_from_db()
    assert "EXTRA_TOKEN" not in server.env and "INTERNAL_API_KEY" in server.env
