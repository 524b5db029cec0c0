"""The audit list (and an agent's rules, and the runs list) in a real Chromium at 1,400 px, beside the admin's menu and the filters, in English and in
Korean: every column is in sight (no sideways scrolling), no word or code is broken after any letter, and each
event reads in words with its code. The pages are saved under ``$PLATFORM_VAR_DIR/screenshots/``."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent, Run
from audit.services import audit_event_record
from tests.browser.conftest import screenshot
from tests.browser.test_versions_pages import in_language, no_horizontal_overflow

pytestmark = pytest.mark.browser


def squeezed_cells(browser: Any, selector: str) -> list[str]:
    """The text of each cell narrower than its longest word: a word or a code broken after any letter, also
    where the page lets words break anywhere (Korean pages do, so such a cell never overflows). A word is what
    the cell's content measures at its narrowest when only spaces, hyphens and ``<wbr>`` may break it (Korean
    kept whole between spaces, as the page's keep-all keeps it)."""
    return list(
        browser.execute_script(
            f"return [...document.querySelectorAll('{selector}')]"
            """.filter(cell => {
                if (cell.getClientRects().length === 0) return false;  // not shown
                const probe = document.createElement('div');
                probe.style.cssText = 'position:absolute;visibility:hidden;width:min-content;white-space:normal;'
                    + 'overflow-wrap:normal;word-break:keep-all;';
                probe.innerHTML = cell.innerHTML;
                cell.appendChild(probe);
                const longest = probe.getBoundingClientRect().width;
                probe.remove();
                const style = getComputedStyle(cell);
                const room = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
                return longest > room + 1 || cell.scrollWidth > cell.clientWidth + 1;
            }).map(cell => cell.textContent.trim())"""
        )
    )


def demo_like_events() -> None:
    """What the demo's runs and its setup write: rule decisions, deterministic and model calls (one refused, one
    retried), configuration changes, with the demo's long server, tool and caller names."""
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    run = Run.objects.create(agent=agent, query="A-1001 자산의 현재 상태를 알려주세요.")
    caller = "api_key:apk__gdi8Fbs"
    common = {"run_id": run.pk, "mcp_id": "sds-company-data", "actor": caller}
    audit_event_record(source="admin", action="config.deterministic_rule.create", mcp_id="sds-company-data",
                       tool="get_asset_status", actor="system:seed_demo")  # fmt: skip
    audit_event_record(source="admin", action="config.tool_contract.update", mcp_id="sds-company-data",
                       tool="get_asset_status_backup", actor="admin:admin")  # fmt: skip
    audit_event_record(source="deterministic", action="rule.decision", tool="list_team_members", ok=True,
                       reason="rule:skipped", attempt=0, **common)  # fmt: skip
    audit_event_record(source="deterministic", tool="get_asset_status", ok=True, latency_ms=14.3, **common)
    audit_event_record(source="agent", tool="list_team_members", ok=False, reason="args:allowed:region", attempt=1,
                       latency_ms=0.4, **common)  # fmt: skip
    audit_event_record(source="agent", tool="get_asset_status_backup", ok=False, reason="rate_limit", attempt=2,
                       latency_ms=1507.7, **common)  # fmt: skip


@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("en", ["tool call", "rule skipped", "argument region not an allowed value", "tool contract changed"]),
        ("ko", ["도구 호출", "규칙 건너뜀", "인자 region 허용되지 않은 값", "도구 계약 변경", "호출 한도 초과"]),
    ],
)
def test_the_audit_list_fits_at_1400_px_and_reads_in_words(
    admin_in_browser: Any, language: str, words: list[str]
) -> None:
    from selenium.webdriver.common.by import By

    demo_like_events()
    browser = admin_in_browser
    in_language(browser, language)
    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/audit/auditevent/")
    screenshot(browser, f"audit-list-{language}")
    no_horizontal_overflow(browser)
    table = browser.find_element(By.ID, "result_list").text
    for shown in [*words, "sds-company-data", "get_asset_status_backup", "args:allowed:region", "api_key:apk__gdi8Fbs"]:
        assert shown in table.replace("\n", " "), shown
    # No cell is narrower than its longest word: a code or a name wraps at its dots, colons and underscores only.
    assert squeezed_cells(browser, "#result_list td, #result_list th") == []
    id_lines = browser.execute_script(
        "const r = document.createRange(); r.selectNodeContents(document.querySelector("
        "'#result_list thead th.column-id .text a')); return r.getClientRects().length"
    )
    assert id_lines == 1  # "ID" on one line (it read I / D)
    times = browser.execute_script(
        "return [...document.querySelectorAll('#result_list .cell-nowrap')].map(e => e.getClientRects().length)"
    )
    assert times and set(times) == {1}  # the date and the time each on one line


@pytest.mark.parametrize("language", ["en", "ko"])
def test_an_agents_page_with_the_demos_rules_fits_at_1400_px(admin_in_browser: Any, language: str) -> None:
    """The agent's rules table (order, name, switch, what each calls, when and with what, in words) sits beside the
    menu without pushing the page sideways."""
    from tests.conftest import bind_demo_server, make_agent

    agent = make_agent(slug="company-assistant", servers=[bind_demo_server()])
    assert agent.rules.count() >= 5
    browser = admin_in_browser
    in_language(browser, language)
    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/agents/agent/{agent.pk}/change/")
    browser.execute_script("document.getElementById('rules-group').scrollIntoView()")
    screenshot(browser, f"agent-rules-{language}")
    no_horizontal_overflow(browser)


@pytest.mark.parametrize("language", ["en", "ko"])
def test_the_runs_list_fits_at_1400_px(admin_in_browser: Any, language: str) -> None:
    """The runs list beside the menu and the filters: the start's date above its time, a failed run's error code
    under its status (wrapping at its colon), the total in milliseconds whole."""
    from selenium.webdriver.common.by import By

    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    for query, status, error in (
        ("김하늘 님은 어느 팀 소속인가요? " * 2, Run.Status.SUCCEEDED, ""),
        ("A-9999 자산 상태 알려줘", Run.Status.FAILED, "deterministic:tool_failed"),
    ):
        Run.objects.create(
            agent=agent, query=query, status=status, error_code=error, timings={"total_ms": 1484.95}, tool_failures=1
        )
    browser = admin_in_browser
    in_language(browser, language)
    browser.set_window_size(1400, 1000)
    browser.get(f"{browser.base_url}/admin/agents/run/")
    screenshot(browser, f"runs-list-{language}")
    no_horizontal_overflow(browser)
    table = browser.find_element(By.ID, "result_list")
    assert "deterministic:tool_failed" in table.text.replace("\n", "")
    assert "1,485.0" in table.text
    assert squeezed_cells(browser, "#result_list td") == []
