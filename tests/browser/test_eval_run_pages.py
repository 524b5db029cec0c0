"""An eval run's pages read at a glance in both languages: the list beside its filters without a cell squeezed
letter by letter (the label went down e/m/p/l/o/y/e/e), a run's missed thresholds and a case's failed checks in
words with their codes, and the comparison of two runs the same way."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from agents.models import DeterministicRule
from agents.services import deterministic_rule_update
from evals.models import EvalRun
from tests.browser.conftest import screenshot
from tests.browser.test_audit_list import squeezed_cells
from tests.evals.conftest import company_assistant, import_seed_set, run_eval

pytestmark = pytest.mark.browser


def two_eval_runs() -> tuple[EvalRun, EvalRun]:
    """The README's pair: the seed set with the demo's rules, then with the employee rule disabled (two cases
    fail on their tools, recall misses its threshold)."""
    agent = company_assistant()
    import_seed_set()
    assert run_eval("company-assistant", "seed-001-tools", "--label", "rules as shipped")[0] == 0
    rule = DeterministicRule.objects.get(agent=agent, name="직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="admin", data={"enabled": False})
    assert run_eval("company-assistant", "seed-001-tools", "--label", "employee rule disabled")[0] == 1
    before, after = EvalRun.objects.order_by("created_at")
    return before, after


@pytest.mark.parametrize(
    ("language", "mismatch", "recall"),
    [("en", "not the expected tools", "tool recall"), ("ko", "기대한 도구와 다름", "도구 재현율")],
)
def test_eval_run_pages_read_in_words(
    transactional_db: Any, admin_in_browser: Any, language: str, mismatch: str, recall: str
) -> None:
    from selenium.webdriver.common.by import By

    before, after = two_eval_runs()
    browser = admin_in_browser
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "path": "/"})
    browser.set_window_size(1400, 900)
    try:
        browser.get(f"{browser.base_url}/admin/evals/evalrun/")
        assert squeezed_cells(browser, "#result_list td, #result_list th") == []
        rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        assert "employee rule disabled" in rows[0].text and "seed-001-tools" in rows[0].text
        assert "company-assistant" in rows[0].find_element(By.CSS_SELECTOR, "td.field-what_ran").text
        screenshot(browser, f"eval-runs-{language}")

        browser.get(f"{browser.base_url}/admin/evals/evalrun/{after.pk}/change/")
        missed = browser.find_element(By.CSS_SELECTOR, "#content p .eval-fail").find_element(By.XPATH, "..").text
        assert f"{recall} 0.6 < 0.75" in missed
        assert browser.find_element(By.CSS_SELECTOR, "#content p code.eval-code").text == "recall"
        cases = browser.find_element(By.CSS_SELECTOR, "table.eval-cases").text
        assert mismatch in cases and "tools:mismatch" in cases
        assert squeezed_cells(browser, "table.eval-cases td") == []

        browser.get(f"{browser.base_url}/admin/evals/evalrun/compare/?a={before.pk}&b={after.pk}")
        compared = browser.find_element(By.CSS_SELECTOR, "table.eval-cases").text
        assert mismatch in compared and "tools:mismatch" in compared
        # The two changed cases first, then the three others under a heading of their own.
        rows = browser.find_elements(By.CSS_SELECTOR, "table.eval-cases tbody tr")
        assert [r.get_attribute("class") for r in rows] == ["eval-changed"] * 2 + ["eval-unchanged-heading"] + [""] * 3
        assert rows[2].text == {"en": "3 cases unchanged", "ko": "그대로인 문항 3개"}[language]
    finally:
        browser.set_window_size(1440, 900)
