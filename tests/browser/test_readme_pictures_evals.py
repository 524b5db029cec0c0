"""The README's picture of two eval runs side by side, taken on purpose (not a check):
``PLATFORM_README_PICTURES=1 ./bin/test tests/browser/test_readme_pictures_evals.py`` writes
``docs/screenshots/eval-compare.png``. Korean text needs a CJK font where Chromium runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.browser.conftest import screenshot
from tests.browser.test_eval_run_pages import two_eval_runs

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(os.environ.get("PLATFORM_README_PICTURES") != "1", reason="set PLATFORM_README_PICTURES=1"),
]

PICTURES = Path(settings.BASE_DIR) / "docs" / "screenshots"


def test_readme_picture_of_two_eval_runs_side_by_side(transactional_db: Any, admin_in_browser: Any) -> None:
    browser = admin_in_browser
    before, after = two_eval_runs()

    browser.set_window_size(1440, 1100)
    browser.get(f"{browser.base_url}/admin/evals/evalrun/compare/?a={before.pk}&b={after.pk}")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1440, min(max(height + 40, 900), 2400))
    print(screenshot(browser, "eval-compare", PICTURES))
