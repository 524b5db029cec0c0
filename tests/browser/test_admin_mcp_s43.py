"""The MCP admin pages at the widths a reviewer found them wanting: the contract editor's every input shows at
1,280 px and is reachable at 800 px, a refused contract outlines only the input its error names, the server's
menus stay within a narrow page, Korean discovery tables keep words whole, and Discover tools, once clicked, is
disabled with Check health and says how long it may take. Pictures are saved under
``$PLATFORM_VAR_DIR/screenshots/``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import screenshot
from tests.browser.navigation import submit

pytestmark = pytest.mark.browser

SCHEMA = {
    "type": "object",
    "properties": {
        "asset_id": {"type": "string", "description": "자산 번호 (예: A-1001)"},
        "room": {"type": "string", "enum": ["A동", "B동"], "description": "회의실 동"},
        "floor": {"type": "integer", "minimum": 1},
        "urgent": {"type": "boolean"},
        "url": {"type": "string", "format": "uri"},
    },
    "required": ["asset_id", "room"],
}

# Each input of the editor's tables not shown where it is (clipped by its box or row, or out of the window): its
# name. A table in its own scrolling box is scrolled to each input, as a person scrolls it.
HIDDEN_INPUTS = """
const tables = [...document.querySelectorAll('table.contract-args')].filter(table => table.getClientRects().length);
return tables.flatMap(table => [...table.querySelectorAll('input:not([type=hidden]), select')].filter(input => {
  input.scrollIntoView({block: 'center', inline: 'nearest'});
  input.closest('.form-row').scrollLeft = 0;  // a person cannot scroll a row that clips (overflow: hidden)
  const frame = (input.closest('.contract-args-scroll') || input.closest('.form-row')).getBoundingClientRect();
  const r = input.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return r.left < frame.left - 1 || r.right > frame.right + 1 || r.right > window.innerWidth || hit !== input;
}).map(input => input.name));
"""


def whole_page(browser: Any, name: str, width: int) -> None:
    browser.set_window_size(width, 900)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(width, min(int(height) + 120, 5000))
    screenshot(browser, name)
    browser.set_window_size(width, 900)


def test_the_contract_editor_shows_every_input_and_marks_only_the_one_in_error(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from mcpregistry.models import McpServer, McpTool, ToolContract
    from tests.browser.test_versions_pages import in_language

    browser = admin_in_browser
    server = McpServer.objects.create(mcp_id="rooms", name="회의실", command="python3", args=[])
    tool = McpTool.objects.create(
        server=server, name="book_room", description="회의실을 예약합니다.", input_schema=SCHEMA
    )
    ToolContract.objects.create(tool=tool, risk="write", args={"room": {"type": "str"}, "url": {"type": "str"}})
    page = f"{browser.base_url}/admin/mcpregistry/mcptool/{tool.pk}/change/"
    browser.set_window_size(1280, 900)
    browser.get(page)
    assert browser.execute_script(HIDDEN_INPUTS) == []  # every input in view, none under another or clipped
    whole_page(browser, "s43-contract-en-1280", 1280)
    browser.set_window_size(800, 900)
    pattern = browser.find_element(By.NAME, "contract-0-args__0__pattern")
    assert browser.execute_script(HIDDEN_INPUTS) == []  # at 800 px the table scrolls: each input reached
    pattern.send_keys("(")
    whole_page(browser, "s43-contract-en-800", 800)
    browser.set_window_size(1280, 900)
    submit(browser, browser.find_element(By.NAME, "_continue"))

    assert "room.pattern:" in browser.find_element(By.CSS_SELECTOR, ".field-args .errorlist").text
    red = browser.execute_script(
        "return [...document.querySelectorAll('fieldset.contract-editor input, fieldset.contract-editor select')]"
        ".filter(e => e.getClientRects().length && getComputedStyle(e).borderTopColor === 'rgb(186, 33, 33)')"
        ".map(e => e.name)"
    )
    assert red == ["contract-0-args__0__pattern"], red
    whole_page(browser, "s43-contract-en-refused", 1280)
    in_language(browser, "ko")
    browser.get(page)
    assert browser.execute_script(HIDDEN_INPUTS) == []
    whole_page(browser, "s43-contract-ko-1280", 1280)
    whole_page(browser, "s43-contract-ko-800", 800)


def test_the_server_page_fits_800_px_and_discovery_says_it_runs(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from tests.browser.test_audit_list import squeezed_cells
    from tests.browser.test_versions_pages import in_language
    from tests.conftest import bind_demo_server

    browser = admin_in_browser
    server = bind_demo_server()
    page = f"{browser.base_url}/admin/mcpregistry/mcpserver/{server.pk}/change/"
    browser.set_window_size(1280, 900)
    browser.get(page)
    state = browser.execute_script(
        "const d = document.getElementById('discover-tools'), h = document.getElementById('check-health');"
        "d.click(); const after = [d.disabled, h.disabled, d.textContent];"
        "d.click(); h.click(); return after;"
    )
    assert state == [True, True, "Discovering… (up to 30 s)"], state
    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li").text
    assert message.startswith("Discovery of sds-company-data:"), message
    assert len(browser.find_elements(By.CSS_SELECTOR, "ul.messagelist li")) == 1  # one discovery, no health check

    in_language(browser, "ko")
    browser.set_window_size(800, 900)
    browser.get(page)
    cut = browser.execute_script(
        "return ['id_session_scope', 'id_transport'].map(id => document.getElementById(id)).filter(select => "
        "select.getBoundingClientRect().right > select.closest('.form-row').getBoundingClientRect().right + 1)"
        ".map(select => select.id)"
    )
    assert cut == []
    assert squeezed_cells(browser, "table.discovery-table td") == []
    whole_page(browser, "s43-server-ko-800", 800)
