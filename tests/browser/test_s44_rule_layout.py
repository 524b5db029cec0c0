"""The rule pages in a real browser at 1,280 and 800 px, in English and Korean (review s44): the rule editor's
condition and parameter inputs stay inside their row (Django's form row clips what overflows it, out of reach);
the rule tester's results table fits at 1,280 px and scrolls in its own box at 800 px, the page never wider than
the window; a long rule name is never drawn under the page's tools (rule tester, history); the agent page's rule
rows show a Korean name of about 14 characters whole, the page within the window; the rules list shows its
"enabled" column at 1,280 px and each rule's whole name at 800 px."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent, DeterministicRule
from tests.browser.conftest import pages_in_both_languages, screenshot
from tests.browser.navigation import submit
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.browser

LONG_NAME = ("자산번호 코드 규칙 " * 20)[:200]
SHORT_NAMES = ("자산번호 코드 규칙", "주문 자산 데이터 조회")

# The elements matching ``arguments[0]`` whose right edge lies past their form row's (which clips it) or the window's.
CUT_OFF = """const width = document.documentElement.clientWidth;
return [...document.querySelectorAll(arguments[0])].filter(e => {
    const box = e.getBoundingClientRect(), row = e.closest('.form-row');
    const edge = row ? Math.min(row.getBoundingClientRect().right, width) : width;
    return box.width > 0 && box.right > edge + 1;
}).map(e => `${e.tagName.toLowerCase()}[${e.name || e.textContent.trim().slice(0, 30)}] ${Math.round(e.getBoundingClientRect().right)}`);"""
PAGE_WIDTH = "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];"


@pytest.fixture
def rules_agent(transactional_db: Any) -> tuple[Agent, DeterministicRule]:
    server = bind_demo_server()
    agent = make_agent(slug="company-assistant", servers=[server])
    long_rule = DeterministicRule.objects.create(
        agent=agent,
        server=server,
        name=LONG_NAME,
        order=300,
        tool_name="search_employee",
        when={"regex": r"(?P<name>[가-힣]{2,4})\s*님", "data": {"order.assetId": "*"}},
        params={"name": "{match.name}"},
    )
    for order, name in enumerate(SHORT_NAMES, start=310):
        DeterministicRule.objects.create(
            agent=agent, server=server, name=name, order=order, tool_name="get_asset_status",
            when={"data": {"order.assetId": "*"}}, params={"asset_id": "{data.order.assetId}"},
        )  # fmt: skip
    return agent, long_rule


def test_the_rule_editors_inputs_and_labels_stay_inside_their_row(
    admin_in_browser: Any, rules_agent: tuple[Agent, DeterministicRule]
) -> None:
    browser, (_agent, rule) = admin_in_browser, rules_agent
    problems = {}
    for language, width in pages_in_both_languages(
        browser, f"/admin/agents/deterministicrule/{rule.pk}/change/", "rule-editor"
    ):
        shown = ".rule-when :is(input, textarea, select, label), .rule-params :is(input, button, th, td)"
        assert len(browser.find_elements("css selector", shown)) > 10
        cut = browser.execute_script(CUT_OFF, shown)
        page = browser.execute_script(PAGE_WIDTH)
        if cut or page[0] > page[1]:
            problems[(language, width)] = (cut, page)
    assert problems == {}


def test_a_long_rule_name_is_never_under_the_pages_tools(
    admin_in_browser: Any, rules_agent: tuple[Agent, DeterministicRule]
) -> None:
    browser, (_agent, rule) = admin_in_browser, rules_agent
    overlaps = {}
    for page in (f"/admin/agents/deterministicrule/{rule.pk}/change/", "/admin/agents/deterministicrule/"):
        for language, width in pages_in_both_languages(
            browser, page, "rule-title" if "change" in page else "rules-list-title"
        ):
            overlap = browser.execute_script(
                """const tools = document.querySelector('.object-tools').getBoundingClientRect();
                return [...document.querySelectorAll('#content > h1, #content > h2')].map(h => {
                    const r = document.createRange(); r.selectNodeContents(h);
                    return [...r.getClientRects()].some(t => t.right > tools.left && t.left < tools.right
                        && t.bottom > tools.top && t.top < tools.bottom) ? h.textContent.slice(0, 20) : '';
                }).filter(Boolean);"""
            )
            if overlap:
                overlaps[(page, language, width)] = overlap
    assert overlaps == {}


def test_the_rule_testers_results_fit_or_scroll_in_their_own_box(
    admin_in_browser: Any, rules_agent: tuple[Agent, DeterministicRule]
) -> None:
    from selenium.webdriver.common.by import By

    browser, (agent, _rule) = admin_in_browser, rules_agent
    problems = {}
    for language, width in pages_in_both_languages(
        browser, f"/admin/agents/rule-tester/?agent={agent.slug}", "rule-tester"
    ):
        browser.find_element(By.NAME, "query").send_keys("김하늘 님은 어느 팀 소속인가요? A-1004 상태")
        submit(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit].default"))
        page = browser.execute_script(PAGE_WIDTH)
        box = browser.execute_script(
            """const table = [...document.querySelectorAll('#content table')].find(t => t.querySelector('tbody tr td code'));
            const box = table.parentElement;
            return {scrolls: getComputedStyle(box).overflowX, table: Math.round(table.getBoundingClientRect().right),
                    box: Math.round(box.getBoundingClientRect().right)};"""
        )
        cut = browser.execute_script(CUT_OFF, "#content form :is(input, textarea, select, label)")
        # At 1,280 px every column shows (the result's too); narrower, the table scrolls inside its own box.
        fits = box["table"] <= box["box"] + 1 if width == 1280 else box["scrolls"] in ("auto", "scroll")
        if page[0] > page[1] or not fits or box["box"] > page[1] or cut:
            problems[(language, width)] = (page, box, cut)
    assert problems == {}


def test_the_agents_rule_rows_show_their_names_and_keep_the_page_within_the_window(
    admin_in_browser: Any, rules_agent: tuple[Agent, DeterministicRule]
) -> None:
    browser, (agent, _rule) = admin_in_browser, rules_agent
    problems = {}
    for language, width in pages_in_both_languages(browser, f"/admin/agents/agent/{agent.pk}/change/", "agent-rules"):
        if width != 1280:
            continue  # the agent's other settings are not these pages' (at 800 px they overflow on their own)
        cut = browser.execute_script(
            """return [...document.querySelectorAll('#rules-group td.field-name input')]
                .filter(i => arguments[0].includes(i.value) && i.scrollWidth > i.clientWidth)
                .map(i => `${i.value} ${i.scrollWidth}>${i.clientWidth}`);""",
            list(SHORT_NAMES),
        )
        rules = browser.find_element("id", "rules-group")
        browser.execute_script("arguments[0].scrollIntoView()", rules)
        rules.screenshot(str(screenshot(browser, f"s44-agent-rules-table-{language}")))
        page = browser.execute_script(PAGE_WIDTH)
        if cut or page[0] > page[1]:
            problems[(language, width)] = (cut, page)
    assert problems == {}


def test_the_rules_list_shows_its_switch_at_1280_and_whole_names_at_800(
    admin_in_browser: Any, rules_agent: tuple[Agent, DeterministicRule]
) -> None:
    browser = admin_in_browser
    problems = {}
    for language, width in pages_in_both_languages(browser, "/admin/agents/deterministicrule/", "rules-list"):
        hidden = browser.execute_script(
            """const results = document.querySelector('#changelist .results').getBoundingClientRect();
            const shown = arguments[0] === 1280 ? '#result_list th.column-enabled, #result_list td.field-enabled'
                                                : '#result_list th.field-rule_name a';
            return [...document.querySelectorAll(shown)].filter(e => {
                const r = document.createRange(); r.selectNodeContents(e);
                return [...r.getClientRects()].some(t => t.right > results.right + 1);
            }).map(e => e.textContent.trim().slice(0, 20));""",
            width,
        )
        page = browser.execute_script(PAGE_WIDTH)
        if hidden or page[0] > page[1]:
            problems[(language, width)] = (hidden, page)
    assert problems == {}
