"""An eval set's page lists its cases one line each (key, question, type), each opened by its button; a case with
an error to fix stays open, and a case added on the page is open to be written. A refused answer regex marks its
own box red, not the box of texts beside it (the admin's row marked both)."""

from __future__ import annotations

from typing import Any

import pytest

from evals.services import eval_case_create, eval_set_create
from tests.browser.conftest import screenshot
from tests.browser.navigation import submit

pytestmark = pytest.mark.browser


def a_set_of_cases(count: int) -> Any:
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "long-set", "thresholds": {}})
    for index in range(count):
        eval_case_create(
            actor="test",
            via="tests",
            data={
                "eval_set": eval_set,
                "key": f"case-{index:02d}",
                "order": index,
                "case_type": "no_tool" if index % 2 else "single_tool",
                "query": f"김하늘 님은 어느 팀 소속인가요? ({index})",
                "expected_tools": [] if index % 2 else ["search_employee"],
            },
        )
    return eval_set


def test_an_eval_sets_cases_are_one_line_each_until_opened(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    eval_set = a_set_of_cases(12)
    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/evals/evalset/{eval_set.pk}/change/")
    group = browser.find_element(By.ID, "cases-group")
    cases = group.find_elements(By.CSS_SELECTOR, ".inline-related.has_original:not(.empty-form)")
    assert len(cases) == 12
    assert not any(c.find_element(By.NAME, f"cases-{i}-query").is_displayed() for i, c in enumerate(cases))
    heading = cases[0].find_element(By.TAG_NAME, "h3").text
    assert "case-00" in heading and "김하늘 님은" in heading and "single_tool" in heading
    assert "no_tool" in cases[1].find_element(By.TAG_NAME, "h3").text
    # The whole list is about a line per case, not twelve forms.
    assert group.size["height"] < 12 * 80, group.size
    browser.execute_script("arguments[0].scrollIntoView()", group)
    screenshot(browser, "eval-set-cases-closed")

    cases[3].find_element(By.CSS_SELECTOR, ".eval-case-toggle").click()
    assert cases[3].find_element(By.NAME, "cases-3-query").is_displayed()
    Select(cases[3].find_element(By.NAME, "cases-3-case_type")).select_by_value("guardrail")
    assert "guardrail" in cases[3].find_element(By.CSS_SELECTOR, ".eval-case-type").text  # the line follows
    assert not cases[4].find_element(By.NAME, "cases-4-query").is_displayed()
    assert cases[3].find_element(By.CSS_SELECTOR, ".eval-case-toggle").text == "Close"
    group.find_element(By.CSS_SELECTOR, ".eval-case-open-all").click()
    assert all(c.find_element(By.NAME, f"cases-{i}-query").is_displayed() for i, c in enumerate(cases))
    group.find_element(By.CSS_SELECTOR, ".eval-case-close-all").click()
    assert not any(c.find_element(By.NAME, f"cases-{i}-query").is_displayed() for i, c in enumerate(cases))

    # A case added on the page is open; a case with an error to fix stays open after the save is refused.
    group.find_element(By.CSS_SELECTOR, ".add-row a").click()
    assert browser.find_element(By.NAME, "cases-12-query").is_displayed()
    cases[5].find_element(By.CSS_SELECTOR, ".eval-case-toggle").click()
    context = cases[5].find_element(By.NAME, "cases-5-context__lines")
    context.clear()
    context.send_keys("tier 3")  # no '=': refused, naming the line
    browser.find_element(By.NAME, "cases-12-key").send_keys("new-case")
    browser.find_element(By.NAME, "cases-12-query").send_keys("새 질문")
    submit(browser, browser.find_element(By.NAME, "_continue"))
    group = browser.find_element(By.ID, "cases-group")
    typed = browser.find_element(By.NAME, "cases-5-context__lines")
    assert typed.is_displayed() and typed.get_attribute("value") == "tier 3"  # shown again as typed
    assert "line 1: write KEY=value" in group.find_element(By.CSS_SELECTOR, "#cases-5 .errorlist").text
    assert not browser.find_element(By.NAME, "cases-4-query").is_displayed()
    assert browser.find_element(By.NAME, "cases-12-query").is_displayed()


def test_the_cases_buttons_speak_the_readers_language(admin_in_browser: Any) -> None:
    from django.conf import settings
    from selenium.webdriver.common.by import By

    eval_set = a_set_of_cases(3)
    browser = admin_in_browser
    browser.add_cookie({"name": settings.LANGUAGE_COOKIE_NAME, "value": "ko", "path": "/"})
    browser.get(f"{browser.base_url}/admin/evals/evalset/{eval_set.pk}/change/")
    toggle = browser.find_element(By.CSS_SELECTOR, "#cases-0 .eval-case-toggle")
    assert toggle.text == "편집"
    assert "모든 문항 펼치기" in browser.find_element(By.ID, "cases-group").text
    toggle.click()
    browser.execute_script("arguments[0].scrollIntoView()", toggle)
    screenshot(browser, "eval-set-cases-ko")


def test_a_refused_regex_marks_its_own_box_red_and_not_the_contains_box(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    eval_set = a_set_of_cases(1)
    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/evals/evalset/{eval_set.pk}/change/")
    browser.find_element(By.CSS_SELECTOR, "#cases-0 .eval-case-toggle").click()
    browser.find_element(By.NAME, "cases-0-answer_checks__contains").send_keys("클라우드운영팀")
    browser.find_element(By.NAME, "cases-0-answer_checks__regex").send_keys("A-[0-9")
    submit(browser, browser.find_element(By.NAME, "_continue"))

    def border(name: str) -> str:
        box = browser.find_element(By.NAME, name)
        return str(browser.execute_script("return getComputedStyle(arguments[0]).borderTopColor", box))

    error = browser.execute_script("return getComputedStyle(document.querySelector('#cases-0 .errorlist')).color")
    regex_box = browser.find_element(By.NAME, "cases-0-answer_checks__regex")
    assert regex_box.is_displayed() and regex_box.get_attribute("value") == "A-[0-9"
    assert border("cases-0-answer_checks__regex") == error
    assert border("cases-0-answer_checks__contains") != error
    assert (
        "the answer matches (a regular expression per line)"
        in browser.find_element(By.CSS_SELECTOR, "#cases-0 .field-answer_checks .errorlist").text
    )
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", regex_box)
    screenshot(browser, "eval-set-refused-regex")
