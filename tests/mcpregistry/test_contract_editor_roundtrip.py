"""The contract editor's round trip: a tool's page posted back as a browser sends it keeps the contract exactly as
stored, with no audit event. Allowed values and required keys that the comma form cannot carry (a value starting
with ``[``, one with a comma, ``"[1]"``) are shown as JSON; an argument the contract does not list stays out of it,
so the gate goes on refusing it, until the admin allows it. The tool is a real stdio MCP server's."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.contract_form import list_text, list_value
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import tool_contract_update
from tests.conftest import discover_as_admin

pytestmark = pytest.mark.django_db

UPDATE = "config.tool_contract.update"
STOCK = {
    "name": "stock",
    "description": "seed 004's stock lookup",
    "inputSchema": {
        "type": "object",
        "properties": {"sku": {"type": "string"}, "region": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["sku", "region", "limit"],
    },
}


class BrowserForm(HTMLParser):
    """The fields of the tool's change form as a browser submits them: a text box's value without line breaks
    (a browser drops them), a text area without the line break after its opening tag, a select's chosen option
    (else its first), a checkbox only when checked."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self._in_form = False
        self._textarea: tuple[str, list[str]] | None = None
        self._select: tuple[str, list[tuple[str, bool]]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == "mcptool_form":
            self._in_form = True
        if not self._in_form or "disabled" in a:
            return
        name = a.get("name", "")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self.fields.append((name, a.get("value") or "on"))
            elif kind not in ("submit", "button", "file", "image", "reset"):
                self.fields.append((name, re.sub("[\r\n]", "", a.get("value", ""))))
        elif tag == "textarea" and name:
            self._textarea = (name, [])
        elif tag == "select" and name:
            self._select = (name, [])
        elif tag == "option" and self._select is not None:
            self._select[1].append((a.get("value", ""), "selected" in a))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._textarea[1].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False
        elif tag == "textarea" and self._textarea is not None:
            name, parts = self._textarea
            self.fields.append((name, "".join(parts).removeprefix("\n")))
            self._textarea = None
        elif tag == "select" and self._select is not None:
            name, options = self._select
            chosen = [value for value, selected in options if selected] or [value for value, _ in options[:1]]
            self.fields.extend((name, value) for value in chosen[:1])
            self._select = None


def change_url(tool: McpTool) -> str:
    return f"/admin/mcpregistry/mcptool/{tool.pk}/change/"


def page_as_posted(page: str, **changes: Any) -> dict[str, Any]:
    """The page's form as a browser posts it, with ``changes`` (None: the field left out, as an unticked box)."""
    form = BrowserForm()
    form.feed(page)
    posted: dict[str, Any] = {}
    for name, value in form.fields:
        posted.setdefault(name, []).append(value)
    posted.update(changes)
    return {name: value for name, value in posted.items() if value is not None}


def saved(client: Client, tool: McpTool, **changes: Any) -> str:
    """Post the page as it renders, with ``changes``; returns the page of a refused save ("" when it was saved)."""
    posted = page_as_posted(client.get(change_url(tool)).content.decode(), **changes)
    response = client.post(change_url(tool), posted)
    return "" if response.status_code == 302 else response.content.decode()


def errors(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))


def updates() -> int:
    return AuditEvent.objects.filter(action=UPDATE).count()


def call(tool: McpTool, args: dict[str, Any]) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=tool.server_id)
    return gate.call(server=server, tool_name=tool.name, args=args, who=gate.GateCall(source="admin"))


def contract_of(tool: McpTool) -> ToolContract:
    return ToolContract.objects.get(tool=tool)


def set_contract(tool: McpTool, **data: Any) -> None:
    tool_contract_update(contract=contract_of(tool), actor="test-admin", via="tests", data=data)


@pytest.fixture
def stock(db: Any) -> Iterator[McpTool]:
    """The stock tool of a real stdio MCP server (it answers "ok"), discovered, its contract marked ``read``."""
    server = McpServer.objects.create(
        mcp_id="stock-data",
        name="stock data",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.raw_jsonrpc_server"],
        cwd=str(settings.BASE_DIR),
        env={"TOOLS": json.dumps([STOCK])},
        public_env=["TOOLS"],
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    tool = server.tools.get(name="stock")
    set_contract(tool, risk="read")
    yield tool
    get_default_pool().close("stock-data")


def row_index(page: str, arg: str) -> str:
    return re.search(rf'name="contract-0-args__(\d+)__name" value="{arg}"', page).group(1)


# --- allowed values and required keys: shown so that they read back as themselves ------------------------------


@pytest.mark.parametrize(
    "allowed",
    [["[긴급]", "[일반]"], ["[1]"], ["a,b", "c"], [" 서울", "부산 "], ["1", "2"], ["[]", "x"], ["한 줄\n두 줄"]],
)
def test_allowed_values_the_comma_form_cannot_carry_survive_an_unchanged_save(
    admin_client: Client, stock: McpTool, allowed: list[str]
) -> None:
    """``["[긴급]", "[일반]"]`` was shown ``[긴급], [일반]``, read back as JSON that did not parse, and saved as the
    one value ``"[긴급], [일반]"`` (audited): the gate then refused ``region="[긴급]"``. ``["[1]"]`` came back as
    the number 1, which a text argument cannot allow: the unchanged page could not be saved."""
    args = {**contract_of(stock).args, "region": {"type": "str", "required": True, "allowed": allowed}}
    set_contract(stock, args=args)
    assert call(stock, {"sku": "A", "region": allowed[0], "limit": 1}).ok
    before = updates()

    assert saved(admin_client, stock) == ""
    assert contract_of(stock).args == args
    assert updates() == before
    assert call(stock, {"sku": "A", "region": allowed[0], "limit": 1}).ok


def test_plain_words_are_shown_comma_separated_and_the_others_as_json(admin_client: Client, stock: McpTool) -> None:
    args = {
        "sku": {"type": "str", "allowed": ["A-1", "B-2"]},
        "region": {"type": "str", "allowed": ["[긴급]", "[일반]"]},
        "limit": {"type": "int", "allowed": [1, 2]},
    }
    set_contract(stock, args=args)
    page = admin_client.get(change_url(stock)).content.decode()
    shown = re.findall(r'name="contract-0-args__\d+__allowed" value="([^"]*)"', page)
    assert shown == ["A-1, B-2", "[긴급], [일반]", "[1, 2]"]  # each reads back as itself


@pytest.mark.parametrize(
    ("values", "item_type"),
    [
        (["[긴급]", "[일반]"], "str"),
        (["[1]"], "str"),
        (["a,b"], ""),
        (["7", "8"], "int"),
        ([7, 8], "int"),
        ([1.5, 2], "float"),
        (["줄\n바꿈"], "str"),
        (["a\rb"], "str"),
        ([" a"], "str"),
        ([], "str"),
        (["plain", "words"], "str"),
    ],
)
def test_a_list_as_the_editor_shows_it_reads_back_as_exactly_itself(values: list[Any], item_type: str) -> None:
    text = list_text(values, item_type)
    assert "\n" not in text and "\r" not in text  # a text box would drop them
    again = list_value(text, item_type)
    assert again == values and [type(v) for v in again or []] == [type(v) for v in values]


def test_a_required_result_key_with_a_comma_survives_an_unchanged_save(admin_client: Client, stock: McpTool) -> None:
    """``["a,b"]`` was split into ``["a", "b"]`` on save."""
    returns = {"type": "dict", "required": ["a,b", "c"]}
    set_contract(stock, returns=returns)
    before = updates()
    assert saved(admin_client, stock) == ""
    assert contract_of(stock).returns == returns
    assert updates() == before
    # Typed as words, the keys are still split at the commas.
    assert saved(admin_client, stock, **{"contract-0-returns__required": "name, team"}) == ""
    assert contract_of(stock).returns == {"type": "dict", "required": ["name", "team"]}


# --- arguments the contract does not list -----------------------------------------------------------------------


def test_an_argument_the_contract_does_not_list_stays_refused_after_an_unchanged_save(
    admin_client: Client, stock: McpTool
) -> None:
    """The table wrote a ``{}`` row for every argument of the input schema: the unchanged page widened the
    contract, and ``limit: 99``, refused before, was sent."""
    args = {"sku": {"type": "str", "required": True}}
    set_contract(stock, args=args)
    assert call(stock, {"sku": "A", "limit": 99}).error == "args:unknown:limit"
    page = admin_client.get(change_url(stock)).content.decode()
    assert page.count("not allowed (not in the contract)") == 2  # region and limit
    before = updates()

    assert saved(admin_client, stock) == ""
    assert contract_of(stock).args == args
    assert updates() == before
    assert call(stock, {"sku": "A", "limit": 99}).error == "args:unknown:limit"


def test_allowing_an_argument_or_filling_its_row_adds_it_to_the_contract(admin_client: Client, stock: McpTool) -> None:
    set_contract(stock, args={"sku": {"type": "str", "required": True}})
    page = admin_client.get(change_url(stock)).content.decode()
    region, limit = row_index(page, "region"), row_index(page, "limit")
    assert (
        saved(
            admin_client,
            stock,
            **{f"contract-0-args__{region}__in_contract": "on", f"contract-0-args__{limit}__max": "5"},
        )
        == ""
    )
    assert contract_of(stock).args == {"sku": {"type": "str", "required": True}, "region": {}, "limit": {"max": 5}}
    assert call(stock, {"sku": "A", "region": "x"}).ok
    assert call(stock, {"sku": "A", "region": "x", "limit": 9}).error == "args:range:limit"
    # Shown as listed now: no box, and saved again unchanged, nothing changes.
    page = admin_client.get(change_url(stock)).content.decode()
    assert "__in_contract" not in page
    before = updates()
    assert saved(admin_client, stock) == ""
    assert updates() == before


@pytest.mark.slow
def test_an_empty_contract_stays_empty_on_an_unchanged_save_and_unticking_an_argument_leaves_it_out(
    admin_client: Client, stock: McpTool
) -> None:
    """A contract that lists no argument allows those of the input schema: each is shown allowed (ticked), and
    the page saved unchanged keeps the contract empty rather than listing them all."""
    set_contract(stock, args={})
    page = admin_client.get(change_url(stock)).content.decode()
    assert page.count('__in_contract" checked') == 3 and "not allowed (not in the contract)" not in page
    before = updates()
    assert saved(admin_client, stock) == ""
    assert contract_of(stock).args == {}
    assert updates() == before

    limit = row_index(page, "limit")
    assert saved(admin_client, stock, **{f"contract-0-args__{limit}__in_contract": None}) == ""
    assert contract_of(stock).args == {"sku": {}, "region": {}}
    assert call(stock, {"sku": "A", "region": "x", "limit": 1}).error == "args:unknown:limit"


def test_unticking_every_argument_of_an_empty_contract_is_refused(admin_client: Client, stock: McpTool) -> None:
    """No listed argument means all of the input schema's: the save would have allowed what was unticked."""
    set_contract(stock, args={})
    page = admin_client.get(change_url(stock)).content.decode()
    unticked = {f"contract-0-args__{row_index(page, arg)}__in_contract": None for arg in ("sku", "region", "limit")}
    page = saved(admin_client, stock, **unticked)
    assert "Allow at least one argument" in errors(page)
    assert contract_of(stock).args == {}


def test_values_that_start_with_a_bracket_typed_comma_separated_are_read_as_several() -> None:
    """``[긴급], [일반]`` typed into the box (no JSON) was kept as one value, which no call could match."""
    from mcpregistry.contract_form import list_text, list_value

    assert list_value("[긴급], [일반]") == ["[긴급]", "[일반]"]
    assert list_value('["[긴급]", "[일반]"]') == ["[긴급]", "[일반]"]
    assert list_value(list_text(["[긴급]", "[일반]"])) == ["[긴급]", "[일반]"]
