"""A tool or server switched off, or deleted, names the enabled rules it leaves failing.

Before, unticking a tool's "enabled" (or its server's) said only that it was saved, and a tool's delete
confirmation listed the tool and its contract, not the rules that call it; afterwards the rules still read enabled
and every run they matched failed ``deterministic:tool_unknown`` (its server off: ``mcp:not_loaded:<id>``). The
tool's and the server's pages now warn with each such rule (its agent, its name linked to its page), and the delete
confirmations (one object's, the list's bulk action's) list them under their own heading: the rules are not deleted
with what they call. A rule switched off, another tool's, or one that asks for its tool (``when.tool_available``:
it skips instead) is not named. mcpregistry asks through a signal (``tool_rules_check``); it imports no agents."""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import trans_real

from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.agents.test_agent_settings_round_trip import page_as_posted
from tests.mcpregistry.test_contract_editor import editor_post

pytestmark = pytest.mark.django_db

OFF_NOW = (
    "Rule '{rule}' ({agent}) calls {tool}, which runs cannot call now: every run the rule matches fails "
    "deterministic:tool_unknown until the rule is changed or switched off, or the tool enabled again."
)


@pytest.fixture
def lookup() -> McpTool:
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    now = timezone.now()
    tool = McpTool.objects.create(
        server=server, name="lookup", input_schema={"type": "object", "required": ["name"]}, discovered_at=now
    )
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}, "limit": {"type": "int"}})
    McpTool.objects.create(server=server, name="report", input_schema={"type": "object"}, discovered_at=now)
    return tool


@pytest.fixture
def rules(lookup: McpTool) -> dict[str, DeterministicRule]:
    agent = Agent.objects.create(slug="ledger", name="장부")
    made = {
        "mine": {"agent": agent, "name": "장부 조회", "tool_name": "lookup"},
        "shared": {"agent": None, "name": "전역 조회", "tool_name": "lookup"},
        "off": {"agent": agent, "name": "꺼진 규칙", "tool_name": "lookup", "enabled": False},
        "other": {"agent": agent, "name": "보고서", "tool_name": "report"},
        "asks": {"agent": agent, "name": "묻는 규칙", "tool_name": "lookup", "when": {"tool_available": "lookup"}},
    }
    return {
        key: DeterministicRule.objects.create(server=lookup.server, params={"name": "김"}, **fields)
        for key, fields in made.items()
    }


def messages_after(client: Client, response: Any) -> list[str]:
    """The page's messages after a redirect, as their HTML."""
    assert response.status_code == 302, response.content.decode()[:3000]
    page = client.get(response.url).content.decode()
    return [m.strip() for m in re.findall(r'<li class="warning">(.*?)</li>', page, re.S)]


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def link(rule: DeterministicRule) -> str:
    return f'<a href="{reverse("admin:agents_deterministicrule_change", args=[rule.pk])}">{rule.name}</a>'


def tool_url(tool: McpTool, page: str = "change") -> str:
    return f"/admin/mcpregistry/mcptool/{tool.pk}/{page}/"


def test_a_tool_switched_off_names_the_enabled_rules_that_call_it_each_linked(admin_client, lookup, rules) -> None:
    response = admin_client.post(tool_url(lookup), editor_post(lookup, enabled=None))
    found = messages_after(admin_client, response)
    assert McpTool.objects.get(pk=lookup.pk).enabled is False  # saved: switching a tool off is never refused
    assert [text(m) for m in found] == [
        OFF_NOW.format(rule="장부 조회", agent="ledger", tool="lookup"),
        OFF_NOW.format(rule="전역 조회", agent="every agent bound to its server", tool="lookup"),
    ]
    assert link(rules["mine"]) in found[0] and link(rules["shared"]) in found[1]


def test_a_tool_left_on_names_no_rule(admin_client, lookup, rules) -> None:
    response = admin_client.post(tool_url(lookup), editor_post(lookup))
    assert messages_after(admin_client, response) == []


def test_a_tool_of_a_disabled_server_names_its_rules_with_the_server_s_reason(admin_client, lookup, rules) -> None:
    McpServer.objects.filter(pk=lookup.server_id).update(enabled=False)
    response = admin_client.post(tool_url(lookup), editor_post(lookup))
    found = [text(m) for m in messages_after(admin_client, response)]
    assert len(found) == 2 and all("mcp:not_loaded:Ledger-Data" in m and "disabled server" in m for m in found)
    assert "장부 조회" in found[0] and "전역 조회" in found[1]


def test_disabling_the_server_names_the_code_rules_that_name_it(admin_client, rules) -> None:
    orders = McpServer.objects.create(mcp_id="order-service", name="orders", command=sys.executable, args=[])
    coded = DeterministicRule.objects.create(
        agent=Agent.objects.get(slug="ledger"), name="주문 코드", code="tests.example_rules.route_order_lookup"
    )
    url = f"/admin/mcpregistry/mcpserver/{orders.pk}/change/"
    left_on = admin_client.post(url, page_as_posted(admin_client.get(url).content.decode()))
    assert messages_after(admin_client, left_on) == []
    posted = page_as_posted(admin_client.get(url).content.decode())
    posted.pop("enabled")
    found = messages_after(admin_client, admin_client.post(url, posted))
    assert McpServer.objects.get(pk=orders.pk).enabled is False
    assert [text(m) for m in found] == [
        "Code rule '주문 코드' (ledger) names the disabled server order-service: every run the rule decides fails "
        "mcp:not_loaded:order-service until the rule is changed or switched off, or the server enabled again."
    ]
    assert link(coded) in found[0]


def test_disabling_the_server_names_the_rules_that_call_its_tools(admin_client, rules) -> None:
    ledger = rules["mine"].server
    ledger_url = f"/admin/mcpregistry/mcpserver/{ledger.pk}/change/"
    posted = page_as_posted(admin_client.get(ledger_url).content.decode())
    posted.pop("enabled")
    found = [text(m) for m in messages_after(admin_client, admin_client.post(ledger_url, posted))]
    named = ["장부 조회", "보고서", "전역 조회"]  # ordered by agent (none last), order, id; not 묻는 규칙, 꺼진 규칙
    assert len(found) == 3 and all(name in m for name, m in zip(named, found, strict=True))
    assert all("mcp:not_loaded:Ledger-Data" in m for m in found)


def rules_left_section(page: str) -> str:
    found = re.search(r'<div id="rules-left">(.*?)</div>', page, re.S)
    return found.group(1) if found else ""


def test_the_tool_s_delete_page_lists_the_rules_that_call_it_and_they_stay(admin_client, lookup, rules) -> None:
    page = admin_client.get(tool_url(lookup, "delete")).content.decode()
    section = rules_left_section(page)
    assert "Enabled rules that call what you delete" in section
    assert "These deterministic rules are not deleted" in section
    assert link(rules["mine"]) in section and link(rules["shared"]) in section
    assert "once the tool is deleted, every run the rule matches fails deterministic:tool_unknown" in text(section)
    assert not any(r.name in section for r in (rules["off"], rules["other"], rules["asks"]))
    assert admin_client.post(tool_url(lookup, "delete"), {"post": "yes"}).status_code == 302
    assert not McpTool.objects.filter(pk=lookup.pk).exists()
    assert DeterministicRule.objects.get(pk=rules["mine"].pk).enabled  # not deleted with the tool


def test_a_tool_no_rule_calls_has_no_such_section(admin_client, lookup) -> None:
    page = admin_client.get(tool_url(lookup, "delete")).content.decode()
    assert 'id="rules-left"' not in page and "Yes, I’m sure" in page


def test_the_list_s_bulk_delete_lists_the_rules_of_every_tool_chosen(admin_client, lookup, rules) -> None:
    report = McpTool.objects.get(server=lookup.server, name="report")
    response = admin_client.post(
        "/admin/mcpregistry/mcptool/", {"action": "delete_selected", "_selected_action": [lookup.pk, report.pk]}
    )
    assert response.status_code == 200
    section = rules_left_section(response.content.decode())
    assert all(link(rules[key]) in section for key in ("mine", "shared", "other"))
    assert rules["off"].name not in section and rules["asks"].name not in section


def test_a_server_s_delete_lists_the_code_rules_naming_it(admin_client, rules) -> None:
    orders = McpServer.objects.create(mcp_id="order-service", name="orders", command=sys.executable, args=[])
    coded = DeterministicRule.objects.create(
        agent=None, name="주문 코드", code="tests.example_rules.route_order_lookup"
    )
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{orders.pk}/delete/").content.decode()
    section = rules_left_section(page)
    assert link(coded) in section and "mcp:not_loaded:order-service" in section
    bulk = admin_client.post(
        "/admin/mcpregistry/mcpserver/", {"action": "delete_selected", "_selected_action": [orders.pk]}
    )
    assert link(coded) in rules_left_section(bulk.content.decode())


@pytest.fixture
def korean_catalogue_entry() -> Iterator[str]:
    """A Korean translation of the warning, put in Django's loaded catalogue for this test only (the lead writes
    the real one): the page shows it only if the text goes through gettext in the reader's language."""
    english = OFF_NOW  # the msgid
    korean = "규칙 '{rule}' ({agent}): {tool} 도구를 지금 부를 수 없습니다 (deterministic:tool_unknown)."
    catalogue = trans_real.translation("ko")._catalog
    before = catalogue.get(english)
    catalogue[english] = korean
    yield korean
    if before is None:
        catalogue._catalogs[0].pop(english, None)
    else:
        catalogue[english] = before


def test_the_korean_page_says_it_through_gettext(admin_client, lookup, rules, korean_catalogue_entry) -> None:
    admin_client.cookies["django_language"] = "ko"
    with translation.override("ko"):
        response = admin_client.post(tool_url(lookup), editor_post(lookup, enabled=None))
        found = [text(m) for m in messages_after(admin_client, response)]
    assert korean_catalogue_entry.format(rule="장부 조회", agent="ledger", tool="lookup") in found
    assert not any("which runs cannot call now" in m for m in found)
