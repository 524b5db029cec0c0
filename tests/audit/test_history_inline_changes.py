"""A page's History lists the changes of the rows edited inline on that page (defect: a tool contract's risk,
changed in the contract editor on the tool's page, was audited but on no History page: the tool's listed only the
tool's own events and a contract has no page of its own; a rule changed on its agent's page was missing from the
agent's). Deleted rows are listed where their record ties them to the object; each row names which row it was.

Also: the tool metrics page pairs each error reason code with its words, as every other admin page does."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from agents.models import Agent, DeterministicRule
from agents.services import deterministic_rule_delete
from audit.admin_changes import ServiceAdminMixin
from audit.changes import audited_delete, audited_save
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import tool_contract_delete, tool_contract_update
from tests.audit.test_admin_changes import LOOKUP_SCHEMA, agent_form, contract_form

pytestmark = pytest.mark.django_db

ACTOR = "system:test"


def audited(obj: Any) -> Any:
    """A configuration row written with its audit event, as a service writes it."""
    return audited_save(obj, actor=ACTOR, via="tests", validate=False)


def text(page: bytes) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.decode()))


def history_rows(client: Client, url: str) -> list[str]:
    """The rows of a History page (``url``), newest first, each as its text."""
    page = client.get(url, HTTP_ACCEPT_LANGUAGE="en")
    assert page.status_code == 200
    body = page.content.decode().split("<tbody>", 1)[-1].split("</tbody>", 1)[0]
    return [text(row.encode()).strip() for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)]


def make_tool(server: McpServer, name: str = "lookup") -> McpTool:
    tool = audited(McpTool(server=server, name=name, input_schema=LOOKUP_SCHEMA, discovered_at=timezone.now()))
    audited(ToolContract(tool=tool, args={"name": {"type": "str", "required": True}}))
    return tool


@pytest.fixture
def vault() -> McpServer:
    return audited(McpServer(mcp_id="vault", name="금고", transport=McpServer.Transport.LOCAL, args=[]))


def test_a_contract_changed_on_its_tools_page_is_in_the_tools_history(admin_client: Client, vault) -> None:
    tool = make_tool(vault)
    response = admin_client.post(
        f"/admin/mcpregistry/mcptool/{tool.pk}/change/", contract_form(tool, **{"contract-0-risk": "write"})
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    changed = AuditEvent.objects.get(action="config.tool_contract.update")

    rows = history_rows(admin_client, f"/admin/mcpregistry/mcptool/{tool.pk}/history/")
    assert len(rows) == 3  # the contract's change and creation, the tool's creation
    assert "tool contract changed: contract of lookup" in rows[0] and "risk" in rows[0]
    assert f"#{changed.seq}" in rows[0]
    assert "tool contract created: contract of lookup" in rows[1]
    assert "MCP tool created" in rows[2]
    assert "contract of" not in rows[2]  # the tool's own change names no other row


def test_a_deleted_contract_stays_in_its_tools_history(admin_client: Client, vault) -> None:
    tool = make_tool(vault)
    tool_contract_update(contract=tool.contract, actor=ACTOR, via="tests", data={"risk": "write"})
    tool_contract_delete(contract=ToolContract.objects.get(tool=tool), actor=ACTOR, via="tests")

    rows = history_rows(admin_client, f"/admin/mcpregistry/mcptool/{tool.pk}/history/")
    assert len(rows) == 4  # the contract's delete, change and creation, the tool's creation
    assert "tool contract deleted: contract of lookup" in rows[0]
    assert "tool contract changed: contract of lookup" in rows[1]


def test_another_tools_contract_is_not_in_a_tools_history(admin_client: Client, vault) -> None:
    tool = make_tool(vault)
    other = make_tool(vault, name="search")
    tool_contract_update(contract=other.contract, actor=ACTOR, via="tests", data={"risk": "write"})
    rows = history_rows(admin_client, f"/admin/mcpregistry/mcptool/{tool.pk}/history/")
    assert len(rows) == 2 and not any("search" in row for row in rows)


def test_a_tool_found_again_under_its_old_name_does_not_show_the_old_tools_contract(admin_client, vault) -> None:
    old = make_tool(vault)
    tool_contract_update(contract=old.contract, actor=ACTOR, via="tests", data={"risk": "write"})
    audited_delete(old, actor=ACTOR, via="tests")  # its contract goes with it
    new = make_tool(vault)
    rows = history_rows(admin_client, f"/admin/mcpregistry/mcptool/{new.pk}/history/")
    assert len(rows) == 2 and not any("changed" in row for row in rows)


@pytest.fixture
def ledger(vault) -> Agent:
    make_tool(vault)
    return audited(Agent(slug="ledger", name="장부 도우미", deterministic_instruction="x"))


def rule_of(agent: Agent | None, server: McpServer, name: str) -> DeterministicRule:
    rule = DeterministicRule(agent=agent, name=name, order=5, server=server, tool_name="lookup")
    rule.params = {"name": "{query}"}
    return audited(rule)


def test_rules_changed_on_the_agents_page_or_deleted_are_in_the_agents_history(admin_client, vault, ledger) -> None:
    rule = rule_of(ledger, vault, "장부 규칙")
    gone = rule_of(ledger, vault, "직원 보유 자산 조회")
    deterministic_rule_delete(rule=gone, actor=ACTOR, via="tests")
    rule_of(None, vault, "남의 규칙")  # no agent's
    rule_of(audited(Agent(slug="other", name="다른")), vault, "다른 규칙")
    response = admin_client.post(
        f"/admin/agents/agent/{ledger.pk}/change/",
        agent_form(
            **{
                "rules-TOTAL_FORMS": "1",
                "rules-INITIAL_FORMS": "1",
                "rules-0-id": str(rule.pk),
                "rules-0-agent": str(ledger.pk),
                "rules-0-order": "7",
                "rules-0-name": "장부 규칙 (사용 중지)",
            }
        ),
    )
    assert response.status_code == 302, response.content.decode()[:3000]

    rows = history_rows(admin_client, f"/admin/agents/agent/{ledger.pk}/history/")
    assert "deterministic rule changed: rule 장부 규칙 (사용 중지)" in rows[0] and "order" in rows[0]
    assert "rule 직원 보유 자산 조회" in rows[1] and "deleted" in rows[1]
    assert "deterministic rule created: rule 직원 보유 자산 조회" in rows[2]
    assert "deterministic rule created: rule 장부 규칙" in rows[3]
    assert "agent created" in rows[4] and "rule" not in rows[4]
    assert len(rows) == 5  # neither the rule of no agent nor another agent's


def test_a_reader_who_may_not_view_rules_sees_only_the_agents_own_changes(client: Client, vault, ledger) -> None:
    rule_of(ledger, vault, "장부 규칙")
    reader = User.objects.create_user(username="viewer", password="pw-for-tests-only-9", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_agent"))
    client.force_login(reader)
    rows = history_rows(client, f"/admin/agents/agent/{ledger.pk}/history/")
    assert len(rows) == 1 and "agent created" in rows[0]


def test_an_objects_history_with_its_inlines_keeps_to_the_newest_rows(admin_client, vault, monkeypatch) -> None:
    monkeypatch.setattr("audit.admin_changes.HISTORY_ROWS", 2)
    tool = make_tool(vault)
    for risk in ("write", "read", "write"):
        tool_contract_update(contract=tool.contract, actor=ACTOR, via="tests", data={"risk": risk})
    latest = AuditEvent.objects.order_by("-seq")[:2]
    rows = history_rows(admin_client, f"/admin/mcpregistry/mcptool/{tool.pk}/history/")
    assert len(rows) == 2 and all(f"#{event.seq}" in row for event, row in zip(latest, rows, strict=True))


def test_every_inline_of_a_service_admin_is_tied_to_its_page_for_the_history() -> None:
    """A History page lists an inline's rows by the key they belong to the page's object by: every inline of
    every service admin has one."""
    from audit.admin_changes import inline_parent_key  # new with the fix: the other tests run on the old code

    for model, model_admin in admin.site._registry.items():
        if not isinstance(model_admin, ServiceAdminMixin):
            continue
        for inline_class in model_admin.inlines:
            inline = inline_class(model, admin.site)
            assert inline_parent_key(inline) is not None, inline_class


# ---- tool metrics ---------------------------------------------------------------------------------------------

_seq = iter(range(10**12, 10**13))


def tool_call(**fields: Any) -> AuditEvent:
    """A failed tool call as the gate records it, written with ``bulk_create`` (off the hash chain)."""
    values = {"source": "agent", "action": "tool.call", "mcp_id": "hr", "tool": "search_employee", "ok": False}
    values.update(fields)
    created_at = timezone.now() - dt.timedelta(hours=1)
    return AuditEvent(**values, attempt=1, created_at=created_at, seq=next(_seq), prev_hash="0" * 64, hash="0" * 64)


@pytest.mark.parametrize(("language", "words"), [("en", "rate limit exceeded"), ("ko", "호출 한도 초과")])
def test_the_metrics_page_names_each_error_reason_in_words_beside_its_code(auditor_client, language, words) -> None:
    AuditEvent.objects.bulk_create(
        [tool_call(reason="rate_limit"), tool_call(reason="rate_limit"), tool_call(reason="odd:code")]
    )
    page = auditor_client.get("/admin/audit/auditevent/metrics/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
    assert f"<li>{words} <code>rate_limit</code>: 2</li>" in page
    assert "<li><code>odd:code</code>: 1</li>" in page  # a code without words, shown once
