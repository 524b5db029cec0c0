"""An audit event's page says what the event says: a configuration change as a table of its settings (the name in
the reader's language beside its code, the value before and after, choices in words, secrets by name only),
what was changed (linked while it exists) and a rule decision as a sentence. The stored JSON is still on the page
(folded), and a record in a shape the page does not know is shown as recorded."""

from __future__ import annotations

import html as html_text
import re
import sys
from typing import Any

import pytest
from django.test import Client

from agents.models import Agent, DeterministicRule, Run
from agents.services import agent_create, agent_delete, agent_update
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_create, mcp_server_update

pytestmark = pytest.mark.django_db

TOKEN = "s3cr3t-token-value-771"


def visible(html: str) -> str:
    return html_text.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.replace("<wbr>", ""))))


def page(client: Client, event: AuditEvent) -> str:
    response = client.get(f"/admin/audit/auditevent/{event.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200
    return response.content.decode()


def table(html: str) -> list[list[str]]:
    """The change table's rows, each cell's visible text."""
    found = re.search(r'<table class="audit-changes">(.*?)</table>', html, re.S)
    assert found is not None, "no change table"
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(1), re.S)
    return [[visible(c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)] for r in rows]


def last(action: str) -> AuditEvent:
    event = AuditEvent.objects.filter(action=action).order_by("-id").first()
    assert event is not None, action
    return event


def test_a_change_lists_each_setting_in_words_with_its_code_before_and_after(admin_client: Client) -> None:
    from mcpregistry.models import McpServer

    agent = agent_create(actor="admin:root", via="admin", data={"slug": "ledger", "name": "장부", "max_iterations": 4})
    # The template calls the default server (PLATFORM_FLOW_DEFAULT_MCP_ID): an agent that could not is refused.
    McpServer.objects.create(
        mcp_id="sds-company-data", name="demo", transport="streamable_http", url="http://127.0.0.1:9/mcp"
    )
    agent_update(
        agent=agent,
        actor="admin:root",
        via="admin",
        data={"max_iterations": 8, "mode": "flow", "flow_graph": "agents.flows.sequential.build_graph"},
    )

    html = page(admin_client, last("config.agent.update"))

    rows = table(html)
    assert rows[0] == ["설정", "이전", "이후"]
    assert ["최대 반복 횟수 max_iterations", "4", "8"] in rows
    mode = next(r for r in rows if r[0].endswith(" mode"))
    assert mode[1].endswith("react") and mode[2].endswith("flow")  # a choice's words beside its code
    assert mode[1] != "react" and mode[2] != "flow"
    text = visible(html)
    assert f"에이전트 #{agent.pk} ledger" in text and f'href="/admin/agents/agent/{agent.pk}/change/"' in html
    assert "max_iterations" in html.split('class="audit-changes"')[1]
    assert '"max_iterations": [' in visible(html)  # the record as stored, folded below


def test_a_creation_lists_its_values_and_a_deletion_what_it_had(admin_client: Client) -> None:
    agent = agent_create(
        actor="admin:root", via="admin", data={"slug": "ledger", "name": "장부 도우미", "enabled": False}
    )
    created = table(page(admin_client, last("config.agent.create")))
    assert created[0] == ["설정", "값"]
    assert ["이름 name", "장부 도우미"] in created and ["사용 enabled", "아니오"] in created

    agent_pk = agent.pk
    agent_delete(agent=agent, actor="admin:root", via="admin")
    html = page(admin_client, last("config.agent.delete"))
    assert table(html)[0] == ["설정", "삭제 당시 값"]
    assert ["이름 name", "장부 도우미"] in table(html)
    assert f"에이전트 #{agent_pk} ledger (더 이상 없음)" in visible(html)  # no link to a page that is gone
    assert f"/admin/agents/agent/{agent_pk}/change/" not in html


def test_a_secret_is_named_never_shown(auditor_client: Client) -> None:
    server = mcp_server_create(
        actor="admin:root",
        via="admin",
        data={"mcp_id": "vault", "name": "금고", "command": sys.executable, "env": {"TOKEN": TOKEN}},
    )
    mcp_server_update(server=server, actor="admin:root", via="admin", data={"env": {"TOKEN": TOKEN + "-2", "NEW": "x"}})

    html = page(auditor_client, last("config.mcp_server.update"))

    assert table(html)[1:] == [["환경 변수 (비밀 값) env", "—", "설정됨: NEW 변경됨: TOKEN"]]
    assert TOKEN not in html


def test_a_change_made_by_a_delete_names_the_deleted_row(admin_client: Client) -> None:
    kept = McpServer.objects.create(mcp_id="kept", name="kept", command=sys.executable, args=[])
    gone = McpServer.objects.create(mcp_id="gone", name="gone", command=sys.executable, args=[])
    agent = Agent.objects.create(slug="bound", name="bound")
    agent.servers.set([kept, gone])
    from mcpregistry.services import mcp_server_delete

    gone_pk = gone.pk
    mcp_server_delete(server=gone, actor="admin:root", via="admin")

    text = visible(page(admin_client, last("config.agent.update")))
    assert f"이 항목이 삭제되어 변경됨: MCP 서버 #{gone_pk} gone (더 이상 없음)" in text
    assert ["MCP 서버 servers", "gone kept", "kept"] in table(page(admin_client, last("config.agent.update")))


def test_a_rule_decision_reads_as_a_sentence(admin_client: Client, auditor_client: Client) -> None:
    agent = Agent.objects.create(slug="calc", name="calc")
    local = McpServer.objects.create(mcp_id="local", name="local", command=sys.executable, args=[])
    rule = DeterministicRule.objects.create(agent=agent, name="증감 계산", server=local, tool_name="calculate")
    run = Run.objects.create(agent=agent, query="3월 대비 증감?")
    event = audit_event_record(
        source="deterministic",
        action="rule.decision",
        run_id=run.pk,
        mcp_id="local",
        tool="calculate",
        call_id=f"rule:{rule.pk}",
        result={"rule": "증감 계산", "matched": False, "reason": "regex did not match"},
        reason="rule:skipped",
        attempt=0,
    )

    html = page(admin_client, event)

    assert f"규칙: 확정 호출 규칙 #{rule.pk} «증감 계산» : 건너뜀 — 정규식이 일치하지 않음" in visible(html)
    assert f'href="/admin/agents/deterministicrule/{rule.pk}/change/"' in html
    assert f'href="/admin/agents/run/{run.pk}/change/"' in html  # the run, linked
    assert "시도 횟수" not in visible(html)  # a decision is no call: no attempt number
    as_auditor = page(auditor_client, event)  # who may not view rules reads the sentence without the link
    assert f"규칙: 확정 호출 규칙 #{rule.pk} «증감 계산»: 건너뜀" in visible(as_auditor)
    assert "/admin/agents/deterministicrule/" not in as_auditor


def test_a_record_in_another_shape_is_shown_as_recorded(auditor_client: Client) -> None:
    odd: dict[str, Any] = {"note": "자유 형식", "count": 3}
    event = audit_event_record(source="admin", action="config.agent.update", args=odd, result={"model": "x.y"})

    html = page(auditor_client, event)

    assert 'class="audit-changes"' not in html
    assert '"note": "자유 형식"' in visible(html) and '"count": 3' in visible(html)


def test_a_recorded_id_of_another_shape_is_shown_not_a_500(auditor_client: Client, admin_client: Client) -> None:
    for reference in ("abc", [1], {"a": 1}):
        event = audit_event_record(
            source="admin",
            action="config.agent.update",
            args={"name": ["a", "b"]},
            result={"model": "agents.agent", "id": reference, "deleted_with": {"model": "auth.user", "id": "bob"}},
        )
        for client in (auditor_client, admin_client):
            assert ["이름 name", "a", "b"] in table(page(client, event)), reference


def test_a_deleted_servers_secrets_are_named_as_cleared(admin_client: Client) -> None:
    from mcpregistry.services import mcp_server_delete

    server = mcp_server_create(
        actor="admin:root",
        via="admin",
        data={"mcp_id": "vault", "name": "금고", "command": sys.executable, "env": {"TOKEN": TOKEN}},
    )
    mcp_server_delete(server=server, actor="admin:root", via="admin")
    html = page(admin_client, last("config.mcp_server.delete"))
    assert ["환경 변수 (비밀 값) env", "삭제됨: TOKEN"] in table(html) and TOKEN not in html


def test_links_go_only_where_the_reader_may_look(auditor_client: Client, admin_client: Client) -> None:
    agent = agent_create(actor="admin:root", via="admin", data={"slug": "ledger", "name": "장부"})
    event = last("config.agent.create")
    assert f'href="/admin/agents/agent/{agent.pk}/change/"' in page(admin_client, event)
    as_auditor = page(auditor_client, event)  # an auditor may not view agents: the record's words, no link
    assert f"/admin/agents/agent/{agent.pk}/change/" not in as_auditor
    assert f"에이전트 #{agent.pk} ledger" in visible(as_auditor) and "더 이상 없음" not in visible(as_auditor)


def test_a_rule_id_that_is_no_number_still_reads_as_a_sentence(admin_client: Client) -> None:
    event = audit_event_record(
        source="deterministic",
        action="rule.decision",
        call_id="rule:²",
        result={"rule": "증감 계산", "matched": True, "reason": "matched"},
        reason="rule:matched",
    )
    assert "규칙: «증감 계산»: 일치" in visible(page(admin_client, event))  # the sentence, unlinked
