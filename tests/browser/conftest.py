"""Admin flows in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``; no browser download),
driven by Selenium against pytest-django's live server.

Each test that fails saves a screenshot under ``$PLATFORM_VAR_DIR/screenshots/`` (and prints where); tests may
also save pictures on purpose with :func:`screenshot` (the README's admin pictures are made this way by
``tests/browser/test_readme_pictures.py`` when ``PLATFORM_README_PICTURES=1``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

pytestmark = pytest.mark.browser

WINDOW = (1440, 900)


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the session (a fresh profile; cookies are cleared between tests)."""
    found = _chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are not installed (.ci/run installs them)")
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def screenshot(driver: Any, name: str, folder: Path | None = None) -> Path:
    target = folder or Path(settings.VAR_DIR) / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def pages_in_both_languages(
    browser: Any, path: str, name: str, widths: tuple[int, ...] = (1280, 800)
) -> Iterator[tuple[str, int]]:
    """``path`` at each of ``widths``, in English and Korean: yields (language, width) with the page loaded; a
    picture of each is kept (``$PLATFORM_VAR_DIR/screenshots/s44-<name>-<language>-<width>``)."""
    for language in ("en", "ko"):
        browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "path": "/"})
        for width in widths:
            browser.set_window_size(width, 900)
            browser.get(f"{browser.base_url}{path}")
            yield language, width
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(width, min(height + 100, 4000))
            screenshot(browser, f"s44-{name}-{language}-{width}")
            browser.set_window_size(width, 900)


@pytest.fixture
def browser(chromium: Any, live_server: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's Chromium, pointed at this test's live server; a screenshot is saved if the test fails."""
    chromium.delete_all_cookies()
    chromium.base_url = live_server.url
    yield chromium
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        path = screenshot(chromium, f"FAILED-{request.node.name}")
        print(f"\nscreenshot of the failure: {path}")


@pytest.fixture
def log_in(browser: Any) -> Callable[[str, str], Any]:
    """Log in through the admin's own login form, as a person would."""
    from selenium.webdriver.common.by import By

    def do(username: str, password: str) -> Any:
        browser.get(f"{browser.base_url}/admin/login/")
        browser.find_element(By.NAME, "username").send_keys(username)
        browser.find_element(By.NAME, "password").send_keys(password)
        from tests.browser.navigation import submit

        submit(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit], button[type=submit]"))
        return browser

    return do


ADMIN_PASSWORD = "admin-Browser-2026"


@pytest.fixture
def admin_in_browser(transactional_db: Any, log_in: Callable[[str, str], Any]) -> Any:
    """A superuser logged in in the browser."""
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("admin", "admin@example.com", ADMIN_PASSWORD)
    return log_in("admin", ADMIN_PASSWORD)
