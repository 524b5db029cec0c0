"""Three small layouts of a Korean admin walk at 1,280 px (review s44), in a real browser, English and Korean: the
rule tester's decision reads on two lines at most (건너뜀: 질의에 키워드가 하나도 없음 went down four lines beside
empty columns), the table still fitting at 1,280 px and scrolling in its own box at 800 px; an eval run's called
tools never start a line with a comma (", calculate" did, after the arguments shown under the tool before it);
the contract editor's allowed hosts input shows its whole placeholder (it was cut at "api.example.com, *.ex")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer
from tests.browser.conftest import pages_in_both_languages
from tests.browser.navigation import submit
from tests.conftest import bind_demo_server, make_agent
from tests.evals.conftest import company_assistant, import_seed_set, run_eval

pytestmark = pytest.mark.browser

PAGE_WIDTH = "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];"

# The lines the text of ``arguments[0]`` is drawn on: one entry per line, its text (each character's box, in order).
LINES = """const lines = [];
const walker = document.createTreeWalker(arguments[0], NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.data.length; i++) {
        if (!node.data[i].trim()) continue;
        const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
        const box = r.getBoundingClientRect();
        if (!box.width) continue;
        const last = lines[lines.length - 1];
        if (last && Math.abs(last.top - box.top) < box.height / 2) last.text += node.data[i];
        else lines.push({top: box.top, text: node.data[i]});
    }
}
return lines.map(l => l.text);"""


def _pages(browser: Any, path: str, name: str, widths: tuple[int, ...] = (1280,)) -> Iterator[tuple[str, int]]:
    """``path`` at each width, in English and Korean (``pages_in_both_languages``; pictures ``s44-small-…``)."""
    return pages_in_both_languages(browser, path, f"small-{name}", widths)


@pytest.fixture
def keyword_agent(transactional_db: Any) -> Agent:
    server = bind_demo_server()
    agent = make_agent(slug="company-assistant", servers=[server])
    DeterministicRule.objects.create(
        agent=agent, server=server, name="자산 상태 조회", order=5, tool_name="get_asset_status",
        when={"any_keywords": ["자산", "asset"]}, params={"asset_id": "A-1004"},
    )  # fmt: skip
    return agent


def test_the_rule_testers_decision_reads_on_two_lines_at_most(admin_in_browser: Any, keyword_agent: Agent) -> None:
    from selenium.webdriver.common.by import By

    browser = admin_in_browser
    problems = {}
    for language, width in _pages(
        browser, f"/admin/agents/rule-tester/?agent={keyword_agent.slug}", "rule-tester", (1280, 800)
    ):
        browser.find_element(By.NAME, "query").send_keys("김하늘 님은 어느 팀 소속인가요?")
        submit(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit].default"))
        cells = browser.find_elements(By.CSS_SELECTOR, ".rule-tester-results tbody tr td:nth-child(5)")
        skipped = [c for c in cells if {"en": "keywords", "ko": "키워드"}[language] in c.text]
        assert skipped, [c.text for c in cells]
        lines = {c.text: browser.execute_script(LINES, c) for c in skipped}
        box = browser.execute_script(
            """const box = document.querySelector('.rule-tester-results'), table = box.querySelector('table');
            return {scrolls: getComputedStyle(box).overflowX, table: Math.round(table.getBoundingClientRect().right),
                    box: Math.round(box.getBoundingClientRect().right)};"""
        )
        page = browser.execute_script(PAGE_WIDTH)
        fits = box["table"] <= box["box"] + 1 if width == 1280 else box["scrolls"] in ("auto", "scroll")
        if any(len(found) > 2 for found in lines.values()) or not fits or page[0] > page[1]:
            problems[(language, width)] = (lines, box, page)
    assert problems == {}


def test_an_eval_runs_called_tools_never_start_a_line_with_a_comma(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    company_assistant()
    import_seed_set()
    assert run_eval("company-assistant", "seed-001-tools")[0] == 0
    from evals.models import EvalRun

    eval_run = EvalRun.objects.get()
    browser = admin_in_browser
    problems = {}
    for language, _width in _pages(browser, f"/admin/evals/evalrun/{eval_run.pk}/change/", "eval-run"):
        cells = browser.find_elements(By.CSS_SELECTOR, "table.eval-cases tbody tr td:nth-child(5)")
        lines = [browser.execute_script(LINES, c) for c in cells]
        # The multi-tool case called both of its tools.
        assert any("classify_request" in "".join(found) and "calculate" in "".join(found) for found in lines), lines
        bad = [found for found in lines if any(line.startswith(",") for line in found)]
        page = browser.execute_script(PAGE_WIDTH)
        if bad or page[0] > page[1]:
            problems[language] = (bad, page)
    assert problems == {}


@pytest.fixture
def demo_binding(transactional_db: Any) -> McpServer:
    return bind_demo_server(mcp_id="sds-company-data")


def test_the_contract_editors_allowed_hosts_input_shows_its_whole_placeholder(
    admin_in_browser: Any, demo_binding: McpServer
) -> None:
    browser = admin_in_browser
    tool = demo_binding.tools.get(name="get_asset_status")
    problems = {}
    for language, _width in _pages(browser, f"/admin/mcpregistry/mcptool/{tool.pk}/change/", "contract-hosts"):
        # Each input's placeholder, as wide as the input's font draws it, against the room inside the input.
        cut = browser.execute_script(
            """const context = document.createElement('canvas').getContext('2d');
            const inputs = [...document.querySelectorAll('table.contract-args input[name$="__allowed_hosts"]')];
            return [inputs.length, inputs.filter(i => {
                const style = getComputedStyle(i);
                context.font = style.font;
                const room = i.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
                return context.measureText(i.placeholder).width > room;
            }).map(i => `${i.name} ${i.clientWidth}`)];"""
        )
        page = browser.execute_script(PAGE_WIDTH)
        assert cut[0] > 0
        if cut[1] or page[0] > page[1]:
            problems[language] = (cut, page)
    assert problems == {}
