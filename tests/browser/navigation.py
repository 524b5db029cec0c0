"""Selenium's click returns before the page it submits has loaded: wait for the old page to go first."""

from __future__ import annotations

from typing import Any


def submit(browser: Any, element: Any, timeout: float = 30) -> None:
    """Click ``element`` (a submit button or link) and wait until the next page has replaced this one."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, timeout).until(expected_conditions.staleness_of(page))
    WebDriverWait(browser, timeout).until(lambda b: b.execute_script("return document.readyState") == "complete")
