"""An API key issued from the admin, then the back button and Save again: the page is never cached, so the form
is made anew (with a fresh token); agents/api_key_form.js puts back the token the form was sent with, and the
admin is told which key that form issued instead of getting a second one."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import ApiKey
from tests.browser.navigation import submit

pytestmark = pytest.mark.browser


def test_back_and_save_again_issues_no_second_key(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/apikey/add/")
    browser.find_element(By.NAME, "name").send_keys("야간 배치")
    submit(browser, browser.find_element(By.NAME, "_save"))
    assert browser.find_element(By.ID, "raw-key").get_attribute("value").startswith("apk_")
    [key] = ApiKey.objects.all()

    browser.back()
    name = browser.find_element(By.NAME, "name")
    if not name.get_attribute("value"):
        name.send_keys("야간 배치")  # whether the browser refills what was typed is its own choice
    submit(browser, browser.find_element(By.NAME, "_save"))
    page = browser.find_element(By.ID, "content").text
    assert "This form was sent before" in page and key.prefix in page
    assert not browser.find_elements(By.ID, "raw-key")
    assert ApiKey.objects.count() == 1

    # A new add page (not the back button) issues a new key.
    browser.get(f"{browser.base_url}/admin/agents/apikey/add/")
    browser.find_element(By.NAME, "name").send_keys("두 번째")
    submit(browser, browser.find_element(By.NAME, "_save"))
    assert browser.find_element(By.ID, "raw-key").get_attribute("value").startswith("apk_")
    assert ApiKey.objects.count() == 2
