"""The budget add form in Chromium at 800 px: the reservation's input shows its default whole (the admin's narrow
integer input showed 20000 as "2000("), and a cost limit typed with a decimal comma reaches the server as typed,
which refuses it and says to use a dot (a number input dropped the comma: "1,5" was saved as $15)."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Budget
from agents.services import api_key_create
from tests.browser.conftest import WINDOW
from tests.browser.navigation import submit

pytestmark = pytest.mark.browser


def test_at_800_px_the_reservation_shows_whole_and_a_decimal_comma_is_refused(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    key, _raw = api_key_create(actor="test", via="tests", name="batch")
    browser.set_window_size(800, WINDOW[1])
    try:
        browser.get(f"{browser.base_url}/admin/agents/budget/add/")
        reservation = browser.find_element(By.NAME, "run_reservation_tokens")
        assert reservation.get_attribute("value") == "20000"
        assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth;", reservation)

        Select(browser.find_element(By.NAME, "api_key")).select_by_value(str(key.pk))
        cost = browser.find_element(By.NAME, "max_cost")
        cost.send_keys("1,5")
        assert cost.get_attribute("value") == "1,5"
        submit(browser, browser.find_element(By.NAME, "_save"))
        assert "Enter a number in US dollars with a dot for cents: 1.5, not 1,5." in browser.page_source
        assert not Budget.objects.exists()
    finally:
        browser.set_window_size(*WINDOW)
