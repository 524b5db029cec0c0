"""What does not show itself is written out (``⟦U+202E⟧``, ``audit.visible``) on the auditor's event page and the
audit list, as the README's "Hidden text" says: the change table's values, the rule decision's sentence, the
event's tool, actor and title, the list's tool and actor columns and its tool filter were drawn raw (only the
folded JSON and the argument rows were written out). And an approval awaited reads on its own page as on the
list: neither succeeded nor failed, where its page showed Django's red ✗ with the untranslated "False"."""

from __future__ import annotations

import re
import sys

import pytest
from django.test import Client

from agents.models import Agent, DeterministicRule
from agents.services import agent_create, agent_update
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_discover
from tests.mcpregistry.test_invisible_text import HIDDEN_ORDER, raw_in, smuggled
from tests.mcpregistry.test_registry_defects import SCHEMA, raw_server

pytestmark = pytest.mark.django_db

LIST = "/admin/audit/auditevent/"
RLO = "\u202e"  # a direction override: "get" + RLO + "eteled" reads "getdeleted"


def page(client: Client, event: AuditEvent) -> str:
    response = client.get(f"{LIST}{event.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200
    return response.content.decode()


def listing(client: Client) -> str:
    response = client.get(LIST, HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200
    return response.content.decode()


def test_a_discovered_description_that_smuggles_tag_characters_is_written_out_on_its_event_page(
    auditor_client: Client,
) -> None:
    server = raw_server("hiding", [{"name": "lookup", "description": "Look up." + smuggled(HIDDEN_ORDER), "inputSchema": SCHEMA}])  # fmt: skip
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    event = AuditEvent.objects.get(action="config.mcp_tool.create", tool="lookup")

    html = page(auditor_client, event)

    assert raw_in(html) == []
    change = html.split('class="audit-changes"')[1]  # the change table, not the folded JSON
    assert "Look up.⟦U+E0049⟧⟦U+E0067⟧" in change


def test_a_renamed_agent_and_a_rule_named_with_a_direction_override_are_written_out(
    admin_client: Client, auditor_client: Client
) -> None:
    agent = agent_create(actor="admin:root", via="admin", data={"slug": "ledger", "name": "장부"})
    agent_update(agent=agent, actor="admin:root", via="admin", data={"name": f"invoice{RLO}fdp.exe"})
    rename = AuditEvent.objects.filter(action="config.agent.update").latest("id")
    local = McpServer.objects.create(mcp_id="local", name="local", command=sys.executable, args=[])
    rule = DeterministicRule.objects.create(agent=Agent.objects.get(), name="증감", server=local, tool_name="calc")
    decision = audit_event_record(
        source="deterministic",
        action="rule.decision",
        mcp_id="local",
        tool="calc",
        call_id=f"rule:{rule.pk}",
        result={"rule": f"증감{RLO}계산", "matched": False, "reason": f"keyword missing: 팀{RLO}장"},
        reason="rule:skipped",
        attempt=0,
    )

    for client in (admin_client, auditor_client):  # the rule linked for one, named only for the other
        renamed, decided = page(client, rename), page(client, decision)
        assert raw_in(renamed) == [] and raw_in(decided) == []
        assert "invoice⟦U+202E⟧fdp.exe" in renamed.split('class="audit-changes"')[1]
        assert "«증감⟦U+202E⟧계산»" in decided and "팀⟦U+202E⟧장" in decided


def test_a_tool_and_an_actor_with_a_direction_override_are_written_out_on_the_list_and_the_event_page(
    auditor_client: Client,
) -> None:
    server = raw_server("hiding", [{"name": f"get{RLO}eteled", "description": "x", "inputSchema": SCHEMA}])
    assert mcp_server_discover(server=server, actor="test", via="tests").ok
    call = audit_event_record(
        source="agent", mcp_id="hiding", tool=f"get{RLO}eteled", actor=f"api_key:a{RLO}b", ok=False,
        reason=f"args:unknown:x{RLO}y",  # an argument the model named, quoted by the reason's words
    )  # fmt: skip

    listed, shown = listing(auditor_client), page(auditor_client, call)

    assert raw_in(listed) == [] and raw_in(shown) == []
    assert "get⟦U+202E⟧eteled" in listed.split('id="changelist-filter"')[1]  # the tool filter's choice
    row = listed[listed.index(f'href="{LIST}{call.pk}/change/"') :].split("</tr>")[0]
    assert "get⟦U+202E⟧eteled" in row and "a⟦U+202E⟧b" in row.replace("<wbr>", "")
    assert f"<title>#{call.pk} tool.call · hiding.get⟦U+202E⟧eteled" in shown
    assert "api_key:a⟦U+202E⟧b" in shown


def outcome_row(html: str) -> str:
    return html[html.index("field-outcome_text") :].split('class="form-row')[0]


def test_an_approval_awaited_shows_no_verdict_on_its_page_and_a_failed_call_reads_failed_in_words(
    auditor_client: Client,
) -> None:
    pending = audit_event_record(
        source="agent", action="approval.request", mcp_id="notes", tool="append_note", ok=False,
        reason="approval:pending", attempt=0,
    )  # fmt: skip
    failed = audit_event_record(source="agent", mcp_id="notes", tool="lookup", ok=False, reason="timeout")

    awaited, timed_out = page(auditor_client, pending), page(auditor_client, failed)

    assert "field-ok" not in awaited and "<img" not in outcome_row(awaited)
    assert "승인 대기" in awaited  # its reason's words say what happened
    assert re.search(r'icon-no\.svg" alt="실패">\s*실패', outcome_row(timed_out))
