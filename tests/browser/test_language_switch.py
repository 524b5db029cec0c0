"""Defect 3 of the Korean admin crawl, in a real browser: the admin had no language switch. An admin reading in
English picks 한국어 from the header's select and the page comes back in Korean (the select submits on change);
the picture is saved as ``$PLATFORM_VAR_DIR/screenshots/language-switch-korean.png``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import screenshot
from tests.browser.navigation import _gone

pytestmark = pytest.mark.browser


def _choose_language(browser: Any, visible_text: str) -> None:
    """Pick ``visible_text`` in the header's language select and wait for the page the change submits to."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page = browser.find_element(By.TAG_NAME, "html")
    Select(browser.find_element(By.ID, "language-select")).select_by_visible_text(visible_text)
    WebDriverWait(browser, 30).until(lambda _b: _gone(page))
    WebDriverWait(browser, 30).until(lambda b: b.execute_script("return document.readyState") == "complete")


def _language(browser: Any) -> str:
    return str(browser.find_element("tag name", "html").get_attribute("lang"))


def test_an_admin_switches_the_language_to_korean_from_the_header(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/agent/")
    assert _language(browser) == "en"
    assert browser.title.endswith("| Agent platform")
    switch = Select(browser.find_element(By.ID, "language-select"))
    assert [option.text for option in switch.options] == ["English", "한국어"]

    _choose_language(browser, "한국어")  # no button to press: the change submits the form

    assert browser.current_url == f"{browser.base_url}/admin/agents/agent/"
    assert _language(browser) == "ko"
    assert browser.title.endswith("| 에이전트 플랫폼"), browser.title
    assert "에이전트 플랫폼 관리" in browser.find_element(By.ID, "site-name").text
    assert Select(browser.find_element(By.ID, "language-select")).first_selected_option.text == "한국어"
    path = screenshot(browser, "language-switch-korean")
    print(f"\nthe admin after switching to Korean: {path}")

    # The choice holds on the next page, and the switch leads back.
    browser.get(f"{browser.base_url}/admin/")
    assert _language(browser) == "ko"
    _choose_language(browser, "English")
    assert _language(browser) == "en" and browser.current_url == f"{browser.base_url}/admin/"


def test_the_language_switch_is_on_the_login_page_too(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{browser.base_url}/admin/login/?next=/admin/")
    assert _language(browser) == "en"

    _choose_language(browser, "한국어")

    assert _language(browser) == "ko"
    assert browser.current_url == f"{browser.base_url}/admin/login/?next=/admin/"
    assert browser.find_element(By.NAME, "username").is_displayed()  # still the login form, now in Korean
