"""The smallest browser flow: an admin logs in and sees the admin index."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser


def test_an_admin_logs_in_and_sees_the_admin(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    assert "/admin/" in admin_in_browser.current_url
    assert "ADMIN" in admin_in_browser.find_element(By.ID, "user-tools").text.upper()
