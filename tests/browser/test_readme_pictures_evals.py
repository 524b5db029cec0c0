"""The README's picture of two eval runs side by side, taken on purpose (not a check):
``PLATFORM_README_PICTURES=1 ./bin/test tests/browser/test_readme_pictures_evals.py`` writes
``docs/screenshots/eval-compare.png``. Korean text needs a CJK font where Chromium runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agents.models import DeterministicRule
from agents.services import deterministic_rule_update
from evals.models import EvalRun
from tests.browser.conftest import screenshot
from tests.evals.conftest import company_assistant, import_seed_set, run_eval

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(os.environ.get("PLATFORM_README_PICTURES") != "1", reason="set PLATFORM_README_PICTURES=1"),
]

PICTURES = Path(settings.BASE_DIR) / "docs" / "screenshots"


def test_readme_picture_of_two_eval_runs_side_by_side(transactional_db: Any, admin_in_browser: Any) -> None:
    browser = admin_in_browser
    agent = company_assistant()
    import_seed_set()
    assert run_eval("company-assistant", "seed-001-tools", "--label", "rules as shipped")[0] == 0
    rule = DeterministicRule.objects.get(agent=agent, name="직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="admin", data={"enabled": False})
    assert run_eval("company-assistant", "seed-001-tools", "--label", "employee rule disabled")[0] == 1
    before, after = EvalRun.objects.order_by("created_at")

    browser.set_window_size(1440, 1100)
    browser.get(f"{browser.base_url}/admin/evals/evalrun/compare/?a={before.pk}&b={after.pk}")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1440, min(max(height + 40, 900), 2400))
    print(screenshot(browser, "eval-compare", PICTURES))
