"""Publish on save reaches every edit that changes what a version freezes: a contract of one of the agent's tools,
whether a tool can be called, and a global rule the agent evaluates. The registry announces its changes by a
signal (``mcpregistry.signals``) that the agents app receives in the same transaction."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import agent_update, agent_version_publish, deterministic_rule_create, deterministic_rule_update
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_tool_update, tool_contract_delete, tool_contract_update
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def publishing(agent: Agent) -> Agent:
    agent_update(agent=agent, actor="test-admin", via="tests", data={"publish_on_save": True})
    agent.refresh_from_db()
    assert agent.live_version is not None
    return agent


def live_number(agent: Agent) -> int | None:
    agent.refresh_from_db()
    return agent.live_version.number if agent.live_version else None


def asset_contract(server: McpServer) -> ToolContract:
    return ToolContract.objects.get(tool__server=server, tool__name="get_asset_status")


def test_a_contract_edit_publishes_the_bound_agents_that_publish_on_save_and_no_other(
    demo_agent: Agent, demo_server: McpServer
) -> None:
    publishing(demo_agent)
    drafting = make_agent(slug="drafting", servers=[demo_server])
    drafted_live = agent_version_publish(agent=drafting, actor="test-admin", via="tests")
    unbound = publishing(make_agent(slug="unbound", servers=[], with_demo_rules=False))
    before = {a.slug: live_number(a) for a in (demo_agent, drafting, unbound)}

    tool_contract_update(
        contract=asset_contract(demo_server), actor="contract-admin", via="admin", data={"timeout_s": 7}
    )

    assert live_number(demo_agent) == before["company-assistant"] + 1  # type: ignore[operator]
    assert demo_agent.live_version.content["contracts"][f"{demo_server.mcp_id}/get_asset_status"]["timeout_s"] == 7  # type: ignore[union-attr]
    assert demo_agent.live_version.note == "published on save"  # type: ignore[union-attr]
    # Recorded as the contract editor's act, by the path the contract came.
    publish = AuditEvent.objects.filter(action="config.agent_version.publish").order_by("-id").first()
    assert publish is not None and (publish.actor, publish.result["via"]) == ("contract-admin", "admin")
    # An agent without publish on save keeps running what was published (the edit is its draft); an agent not
    # bound to the server is not touched.
    assert live_number(drafting) == drafted_live.number
    assert live_number(unbound) == before["unbound"]
    assert AgentVersion.objects.filter(agent=unbound).count() == 1


def test_a_contract_edit_that_changes_nothing_frozen_publishes_no_version(
    demo_agent: Agent, demo_server: McpServer
) -> None:
    first = live_number(publishing(demo_agent))
    contract = asset_contract(demo_server)
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"timeout_s": contract.timeout_s})
    assert live_number(demo_agent) == first
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1


def test_deleting_a_contract_and_disabling_a_tool_publish_too(demo_agent: Agent, demo_server: McpServer) -> None:
    first = live_number(publishing(demo_agent))
    assert first is not None
    tool_contract_update(contract=asset_contract(demo_server), actor="t", via="tests", data={"timeout_s": 9})
    tool_contract_delete(contract=asset_contract(demo_server), actor="t", via="tests")
    assert live_number(demo_agent) == first + 2
    assert demo_agent.live_version.content["contracts"][f"{demo_server.mcp_id}/get_asset_status"]["timeout_s"] != 9  # type: ignore[union-attr]
    tool = McpTool.objects.get(server=demo_server, name="get_asset_status")
    mcp_tool_update(tool=tool, actor="t", via="tests", data={"enabled": False})
    assert live_number(demo_agent) == first + 3
    assert f"{demo_server.mcp_id}/get_asset_status" not in demo_agent.live_version.content["contracts"]  # type: ignore[union-attr]


def test_a_contract_edit_refused_by_validation_publishes_nothing(demo_agent: Agent, demo_server: McpServer) -> None:
    first = live_number(publishing(demo_agent))
    with pytest.raises(ValidationError):
        tool_contract_update(contract=asset_contract(demo_server), actor="t", via="tests", data={"risk": "dangerous"})
    assert live_number(demo_agent) == first


def test_a_global_rule_edit_publishes_the_agents_that_evaluate_it(demo_agent: Agent, demo_server: McpServer) -> None:
    first = live_number(publishing(demo_agent))
    assert first is not None
    rule = deterministic_rule_create(
        actor="t",
        via="tests",
        data={
            "agent": None,
            "server": demo_server,
            "name": "전역 자산 규칙",
            "order": 5,
            "tool_name": "get_asset_status",
            "when": {"regex": r"(?P<asset_id>A-\d{4})", "any_keywords": ["전역"]},
            "params": {"asset_id": "{match.asset_id}"},
        },
    )
    assert live_number(demo_agent) == first + 1
    assert "전역 자산 규칙" in [r["name"] for r in demo_agent.live_version.content["rules"]]  # type: ignore[union-attr]
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"enabled": False})
    assert live_number(demo_agent) == first + 2
    assert "전역 자산 규칙" not in [r["name"] for r in demo_agent.live_version.content["rules"]]  # type: ignore[union-attr]


def test_moving_a_rule_to_another_agent_publishes_both(demo_agent: Agent, demo_server: McpServer) -> None:
    other = publishing(make_agent(slug="other", servers=[demo_server], with_demo_rules=False))
    publishing(demo_agent)
    first, other_first = live_number(demo_agent), live_number(other)
    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order").first()
    assert rule is not None
    rule.agent = other
    deterministic_rule_update(rule=rule, actor="t", via="tests")
    assert (live_number(demo_agent), live_number(other)) == (first + 1, other_first + 1)  # type: ignore[operator]
