"""Selenium's click returns before the page it submits has loaded: wait for the old page to go first."""

from __future__ import annotations

from typing import Any


def submit(browser: Any, element: Any, timeout: float = 30) -> None:
    """Click ``element`` (a submit button or link, or a ``(By, value)`` locator to find it) and wait until the
    next page has replaced this one. With a locator, a page still settling (a script re-rendering the form) is
    given a few tries."""
    import time

    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout).until(lambda b: b.execute_script("return document.readyState") == "complete")
    page = browser.find_element(By.TAG_NAME, "html")
    if isinstance(element, tuple):
        for attempt in range(5):
            try:
                browser.find_element(*element).click()
                break
            except (StaleElementReferenceException, WebDriverException):
                if attempt == 4:
                    raise
                time.sleep(0.3)
                page = browser.find_element(By.TAG_NAME, "html")
    else:
        element.click()
    WebDriverWait(browser, timeout).until(lambda _b: _gone(page))
    WebDriverWait(browser, timeout).until(lambda b: b.execute_script("return document.readyState") == "complete")


def _gone(page: Any) -> bool:
    """``expected_conditions.staleness_of``, also when Chromium answers a node of the page being replaced with
    an inspector error ("Node with given id does not belong to the document") instead of a stale reference."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        page.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc) or "No node with given id" in str(exc):
            return True
        raise
    return False
