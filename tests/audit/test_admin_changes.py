"""Changes made in the admin are audited: who created, changed or deleted a binding, a tool contract, a rule, an
agent or an API key, the diff of its fields, and never a secret value. Persona: an admin (``admin_client``)."""

from __future__ import annotations

import json
import sys
from unittest import mock

import pytest
from django.utils import timezone

from agents.models import Agent, ApiKey, DeterministicRule
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.conftest import DEMO_SECRET
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db

OTHER_SECRET = "Bearer sk-header-secret-8d1e4f0a2b9c"
LOOKUP_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def admin_events(action: str | None = None) -> list[AuditEvent]:
    events = AuditEvent.objects.filter(source="admin").order_by("id")
    return list(events.filter(action=action) if action else events)


def no_secret_anywhere() -> None:
    """No audit event, in any field, holds a secret value."""
    for row in AuditEvent.objects.values():
        text = json.dumps(row, ensure_ascii=False, default=str)
        assert DEMO_SECRET not in text and OTHER_SECRET not in text and "sk-header-secret" not in text


@pytest.fixture
def vault(admin_client) -> McpServer:  # type: ignore[no-untyped-def]
    """A binding created through the admin form with an env secret, and a discovered tool with a contract."""
    response = post_server_form(
        admin_client, None, mcp_id="vault", name="금고", new_env=f"INTERNAL_API_KEY={DEMO_SECRET}"
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    server = McpServer.objects.get(mcp_id="vault")
    tool = McpTool.objects.create(
        server=server, name="lookup", input_schema=LOOKUP_SCHEMA, discovered_at=timezone.now()
    )
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}})
    return server


# ---- bindings -------------------------------------------------------------------------------------------------


def test_creating_a_binding_records_its_fields_and_only_that_its_env_changed(vault, admin_user) -> None:
    [event] = admin_events("config.mcp_server.create")
    assert (event.actor, event.mcp_id, event.source) == (admin_user.username, "vault", "admin")
    assert event.args["mcp_id"] == [None, "vault"] and event.args["name"] == [None, "금고"]
    assert event.args["command"] == [None, sys.executable]
    assert event.args["env"] == {"set": ["INTERNAL_API_KEY"]}  # the name, never the value
    assert "headers" not in event.args  # none were set
    assert event.result == {"model": "mcpregistry.mcpserver", "id": vault.pk, "name": "vault", "via": "admin"}
    no_secret_anywhere()


def test_changing_a_binding_records_the_diff_and_a_secret_change_without_its_value(admin_client, vault) -> None:
    response = post_server_form(admin_client, vault, timeout_s="12", new_headers=f"Authorization={OTHER_SECRET}")
    assert response.status_code == 302, response.content.decode()[:3000]
    [event] = admin_events("config.mcp_server.update")
    assert event.args == {"timeout_s": [30.0, 12.0], "headers": {"set": ["Authorization"]}}
    response = post_server_form(admin_client, vault, timeout_s="12", new_env="INTERNAL_API_KEY=" + "x" * 40)
    assert response.status_code == 302
    assert admin_events("config.mcp_server.update")[-1].args == {"env": {"changed": ["INTERNAL_API_KEY"]}}
    no_secret_anywhere()
    assert "x" * 40 not in json.dumps(list(AuditEvent.objects.values("args", "result")))


def test_saving_a_binding_unchanged_records_nothing(admin_client, vault) -> None:
    before = AuditEvent.objects.count()
    assert post_server_form(admin_client, vault).status_code == 302
    assert AuditEvent.objects.count() == before


def test_clearing_the_secrets_is_recorded_as_a_change(admin_client, vault) -> None:
    assert post_server_form(admin_client, vault, clear_secrets="on").status_code == 302
    assert admin_events("config.mcp_server.update")[-1].args == {"env": {"cleared": ["INTERNAL_API_KEY"]}}
    assert McpServer.objects.get(pk=vault.pk).env == {}


def test_deleting_a_binding_records_what_it_was_and_what_went_with_it(admin_client, vault) -> None:
    response = admin_client.post(f"/admin/mcpregistry/mcpserver/{vault.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not McpServer.objects.filter(pk=vault.pk).exists()
    [event] = admin_events("config.mcp_server.delete")
    assert (
        event.mcp_id == "vault"
        and event.args["name"] == ["금고", None]
        and event.args["env"] == {"cleared": ["INTERNAL_API_KEY"]}
    )
    assert event.result["also_deleted"] == {"mcpregistry.mcptool": 1, "mcpregistry.toolcontract": 1}
    no_secret_anywhere()


def test_a_delete_page_names_the_links_that_go_with_a_binding_by_their_two_ends(admin_client, vault) -> None:
    """It listed "Agent-mcpserver relationship: Agent_servers object (1)", in English in a Korean admin too."""
    agent = Agent.objects.create(slug="helper", name="도우미")
    agent.servers.add(vault)
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{vault.pk}/delete/").content.decode()
    assert "Link between agent and MCP server: helper ↔ vault" in page
    assert "relationship" not in page and "object (" not in page
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{vault.pk}/delete/", HTTP_ACCEPT_LANGUAGE="ko")
    page = page.content.decode()
    assert "에이전트·MCP 서버 연결: helper ↔ vault" in page


# ---- tools and contracts --------------------------------------------------------------------------------------


def contract_form(tool: McpTool, **changes: str) -> dict[str, str]:
    contract = tool.contract
    data = {
        "enabled": "on",
        "contract-TOTAL_FORMS": "1",
        "contract-INITIAL_FORMS": "1",
        "contract-MIN_NUM_FORMS": "0",
        "contract-MAX_NUM_FORMS": "1",
        "contract-0-id": str(contract.pk),
        "contract-0-tool": str(tool.pk),
        "contract-0-risk": contract.risk,
        "contract-0-args": json.dumps(contract.args),
        "contract-0-unknown_args": contract.unknown_args,
        "contract-0-returns": json.dumps(contract.returns),
        "contract-0-retry": json.dumps(contract.retry),
        "contract-0-timeout_s": "",
        "contract-0-fallback_tool": "",
        "contract-0-fallback_policy": contract.fallback_policy,
        "contract-0-memo": "on",
        "contract-0-memo_ttl_s": "",
        "contract-0-idempotency_arg": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_editing_a_tool_contract_records_the_contract_diff_against_its_server_and_tool(admin_client, vault) -> None:
    tool = vault.tools.get()
    url = f"/admin/mcpregistry/mcptool/{tool.pk}/change/"
    response = admin_client.post(url, contract_form(tool, **{"contract-0-risk": "write", "contract-0-timeout_s": "5"}))
    assert response.status_code == 302, response.content.decode()[:3000]
    [event] = admin_events("config.tool_contract.update")
    assert (event.mcp_id, event.tool) == ("vault", "lookup")
    assert event.args == {"risk": ["read", "write"], "timeout_s": [None, 5.0]}
    assert admin_events("config.mcp_tool.update") == []  # the tool itself did not change


def test_disabling_a_tool_is_recorded(admin_client, vault) -> None:
    tool = vault.tools.get()
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", contract_form(tool, enabled=None))
    assert response.status_code == 302
    [event] = admin_events("config.mcp_tool.update")
    assert event.args == {"enabled": [True, False]} and event.tool == "lookup"


# ---- rules, agents, API keys ----------------------------------------------------------------------------------


def rule_form(server: McpServer, **changes: str) -> dict[str, str]:
    data = {
        "agent": "",
        "name": "이름 조회",
        "order": "10",
        "enabled": "on",
        "server": str(server.pk),
        "tool_name": "lookup",
        "code": "",
        "when": json.dumps({"any_keywords": ["이름"]}, ensure_ascii=False),
        "params": json.dumps({"name": "{query}"}),
        "answer_template": "",
    }
    data.update(changes)
    return data


def test_creating_and_changing_a_rule_is_recorded(admin_client, vault) -> None:
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_form(vault))
    assert response.status_code == 302, response.content.decode()[:3000]
    [created] = admin_events("config.deterministic_rule.create")
    assert (created.mcp_id, created.tool) == ("vault", "lookup")
    assert created.args["name"] == [None, "이름 조회"] and created.args["params"] == [None, {"name": "{query}"}]
    assert created.args["server"] == [None, "vault"]
    rule = DeterministicRule.objects.get()
    response = admin_client.post(f"/admin/agents/deterministicrule/{rule.pk}/change/", rule_form(vault, order="20"))
    assert response.status_code == 302
    [changed] = admin_events("config.deterministic_rule.update")
    assert changed.args == {"order": [10, 20]}


def test_deleting_rules_in_bulk_records_each_one(admin_client, vault) -> None:
    rules = [DeterministicRule.objects.create(name=f"r{i}", server=vault, tool_name="lookup") for i in range(3)]
    response = admin_client.post(
        "/admin/agents/deterministicrule/",
        {"action": "delete_selected", "post": "yes", "_selected_action": [str(r.pk) for r in rules]},
    )
    assert response.status_code == 302
    assert not DeterministicRule.objects.exists()
    events = admin_events("config.deterministic_rule.delete")
    assert sorted(e.args["name"][0] for e in events) == ["r0", "r1", "r2"]
    assert {e.result["id"] for e in events} == {r.pk for r in rules}


def agent_form(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "slug": "ledger",
        "name": "장부 도우미",
        "enabled": "on",
        "mode": "react",
        "system_prompt": "",
        "deterministic_instruction": "x",
        "answer_template": "",
        "model_provider": "offline",
        "model_id": "",
        "model_params": "{}",
        "servers": [],
        "max_iterations": "6",
        "rules-TOTAL_FORMS": "0",
        "rules-INITIAL_FORMS": "0",
        "rules-MIN_NUM_FORMS": "0",
        "rules-MAX_NUM_FORMS": "1000",
    }
    data.update(changes)
    return data


def test_an_agent_and_the_rules_changed_on_its_page_are_recorded_in_order(admin_client, vault) -> None:
    assert admin_client.post("/admin/agents/agent/add/", agent_form()).status_code == 302
    agent = Agent.objects.get(slug="ledger")
    [created] = admin_events("config.agent.create")
    assert created.args["slug"] == [None, "ledger"] and "servers" not in created.args
    rule = DeterministicRule.objects.create(
        agent=agent, name="장부 규칙", order=5, server=vault, tool_name="lookup", params={"name": "{query}"}
    )
    response = admin_client.post(
        f"/admin/agents/agent/{agent.pk}/change/",
        agent_form(
            servers=[vault.pk],
            max_iterations="8",
            **{
                "rules-TOTAL_FORMS": "2",
                "rules-INITIAL_FORMS": "1",
                "rules-0-id": str(rule.pk),
                "rules-0-agent": str(agent.pk),
                "rules-0-order": "7",
                "rules-0-name": "장부 규칙 (사용 중지)",
                # A row added to the table is not a rule: rules are added in the rule editor, which checks them.
                "rules-1-order": "9",
                "rules-1-name": "몰래 추가",
                "rules-1-enabled": "on",
                "rules-1-server": str(vault.pk),
                "rules-1-tool_name": "lookup",
                "rules-1-when": "{}",
                "rules-1-params": json.dumps({"name": "{query}"}),
            },
        ),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    updated, rule_updated = admin_events()[-2:]
    assert updated.action == "config.agent.update"
    assert updated.args == {"servers": [[], ["vault"]], "max_iterations": [6, 8]}
    assert rule_updated.action == "config.deterministic_rule.update"
    assert rule_updated.args == {
        "enabled": [True, False],
        "name": ["장부 규칙", "장부 규칙 (사용 중지)"],
        "order": [5, 7],
    }
    assert list(agent.rules.values_list("name", flat=True)) == ["장부 규칙 (사용 중지)"]


def test_deleting_an_agent_records_the_rules_that_went_with_it(admin_client, vault) -> None:
    agent = Agent.objects.create(slug="gone", name="gone")
    DeterministicRule.objects.create(agent=agent, name="r", server=vault, tool_name="lookup")
    assert admin_client.post(f"/admin/agents/agent/{agent.pk}/delete/", {"post": "yes"}).status_code == 302
    [event] = admin_events("config.agent.delete")
    assert event.result["also_deleted"] == {"agents.deterministicrule": 1}
    assert event.args["slug"] == ["gone", None]


def test_renaming_and_revoking_an_api_key_is_recorded_without_its_digest(admin_client) -> None:
    key = ApiKey.objects.create(name="old", prefix="apk_abcdefgh", digest="d" * 64)
    response = admin_client.post(f"/admin/agents/apikey/{key.pk}/change/", {"name": "new", "rate": "60/min"})
    assert response.status_code == 302, response.content.decode()[:3000]
    [event] = admin_events("config.api_key.update")
    assert event.args["name"] == ["old", "new"]
    assert "d" * 64 not in json.dumps(event.args) + json.dumps(event.result)
    assert event.result["name"] == "new (apk_abcdefgh…)"
    # Revoking is an action (revoked_at is read-only on the form), audited too.
    admin_client.post("/admin/agents/apikey/", {"action": "revoke", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert AuditEvent.objects.filter(action="config.api_key.revoke").exists()


# ---- one transaction ------------------------------------------------------------------------------------------


def test_a_change_whose_audit_record_fails_is_not_saved(admin_client, vault) -> None:
    with (
        mock.patch("audit.changes.audit_event_record", side_effect=RuntimeError("audit down")),
        pytest.raises(RuntimeError, match="audit down"),
    ):
        post_server_form(admin_client, vault, timeout_s="12", name="바뀐 이름")
    vault.refresh_from_db()
    assert (vault.timeout_s, vault.name) == (30.0, "금고")


def test_a_delete_whose_audit_record_fails_is_not_made(admin_client, vault) -> None:
    with (
        mock.patch("audit.changes.audit_event_record", side_effect=RuntimeError("audit down")),
        pytest.raises(RuntimeError),
    ):
        admin_client.post(f"/admin/mcpregistry/mcpserver/{vault.pk}/delete/", {"post": "yes"})
    assert McpServer.objects.filter(pk=vault.pk).exists()


def test_a_rule_row_whose_parameters_no_longer_fit_tells_so_on_the_agents_page(admin_client, vault) -> None:
    agent = Agent.objects.create(slug="ledger", name="장부 도우미")
    # Stored before its tool required 'name' (or by a path that did not check): the row does not show params.
    rule = DeterministicRule.objects.create(agent=agent, name="장부 규칙", order=5, server=vault, tool_name="lookup")
    before = AuditEvent.objects.count()
    response = admin_client.post(
        f"/admin/agents/agent/{agent.pk}/change/",
        agent_form(
            **{
                "rules-TOTAL_FORMS": "1",
                "rules-INITIAL_FORMS": "1",
                "rules-0-id": str(rule.pk),
                "rules-0-agent": str(agent.pk),
                "rules-0-order": "7",
                "rules-0-name": "장부 규칙",
                "rules-0-enabled": "on",
            }
        ),
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert response.status_code == 200  # the page again, with the row's problem; not a 500
    page = response.content.decode()
    assert "파라미터 템플릿: args:missing:name" in page and "규칙 편집기에서 바꾸세요" in page
    assert DeterministicRule.objects.get(pk=rule.pk).order == 5 and AuditEvent.objects.count() == before


def test_a_stale_rule_left_untouched_does_not_stop_the_agents_own_changes(admin_client, vault) -> None:
    agent = Agent.objects.create(slug="ledger", name="장부 도우미")
    stale = DeterministicRule.objects.create(agent=agent, name="장부 규칙", order=5, server=vault, tool_name="lookup")
    response = admin_client.post(
        f"/admin/agents/agent/{agent.pk}/change/",
        agent_form(
            max_iterations="9",
            **{
                "rules-TOTAL_FORMS": "1",
                "rules-INITIAL_FORMS": "1",
                "rules-0-id": str(stale.pk),
                "rules-0-agent": str(agent.pk),
                "rules-0-order": "5",
                "rules-0-name": "장부 규칙",
                "rules-0-enabled": "on",
            },
        ),
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Agent.objects.get(pk=agent.pk).max_iterations == 9
    assert [e.action for e in admin_events()][-1] == "config.agent.update"
