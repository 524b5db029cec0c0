"""A published version keeps the tool contracts it froze; when a server later renames a tool's argument
(``lookup(name)`` becomes ``lookup(full_name)``) and the review is approved (which fits the draft's contract
only), the version's runs are not offered that tool, the trace and the worker's log say why, and the version's
page warns the admin to publish again. Real stdio server, real runs; only the model is scripted."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from agents.admin_runs import run_timeline
from agents.execution import run_execute
from agents.models import Agent, AgentVersion, DeterministicRule, Run
from agents.services import agent_version_publish, run_submit
from agents.version_view import contract_out_of_date, version_stale_tools
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_discover, mcp_tool_review_approve
from tests.agents.test_openai_compatible import openai_agent
from tests.conftest import make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

NAME_ONLY = {"name": {"type": "str", "required": True}}


@pytest.mark.parametrize(
    ("contract_args", "schema", "stale"),
    [
        # renamed: the contract names an argument the (closed) schema no longer has
        (NAME_ONLY, {"properties": {"full_name": {"type": "string"}}, "required": ["full_name"]}, True),
        # a new required argument the contract does not know, in a schema that takes any other name
        (
            NAME_ONLY,
            {"properties": {"name": {}, "team": {}}, "required": ["name", "team"], "additionalProperties": True},
            True,
        ),
        # an optional argument the admin left out of the contract: as published
        (NAME_ONLY, {"properties": {"name": {}, "limit": {}}, "required": ["name"]}, False),
        # an open schema: the contract's own argument is no contradiction
        (NAME_ONLY, {"properties": {}, "additionalProperties": True}, False),
        # a contract without arguments takes the schema's
        ({}, {"properties": {"full_name": {}}, "required": ["full_name"]}, False),
    ],
    ids=["renamed", "new-required", "narrowed", "open-schema", "no-contract-args"],
)
def test_a_frozen_contract_is_out_of_date_only_where_it_contradicts_the_schema(
    contract_args: dict[str, Any], schema: dict[str, Any], stale: bool
) -> None:
    assert contract_out_of_date(contract_args, schema) is stale


def stale_contract_server(mcp_id: str = "stale") -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.stale_contract_server"],
        cwd=str(settings.BASE_DIR),
        env={"LOOKUP_ARG": "name"},
        public_env=["LOOKUP_ARG"],  # the fixture's setting, not a secret
        session_scope="shared",
    )
    assert mcp_server_discover(server=server, actor="test", via="tests").ok
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    return server


def rename_lookups_argument(server: McpServer, admin: Any) -> None:
    """The server now takes ``full_name``; the admin rediscovers it and approves the review (the draft's contract
    is fitted to the new schema, the published version's is not)."""
    server.env = {"LOOKUP_ARG": "full_name"}
    server.save()
    get_default_pool().close(server.mcp_id)
    assert mcp_server_discover(server=server, actor="test", via="tests").ok
    tool = McpTool.objects.get(server=server, name="lookup")
    assert tool.review_required
    assert mcp_tool_review_approve(tool=tool, actor=admin, via="tests")
    assert list(ToolContract.objects.get(tool=tool).args) == ["full_name"]


def published(agent: Agent, admin: Any) -> AgentVersion:
    agent.language = "en"
    agent.publish_on_save = False
    agent.save()
    return agent_version_publish(agent=Agent.objects.get(pk=agent.pk), actor=admin, via="tests")


def run_of(agent: Agent, query: str) -> Run:
    run = run_submit(agent_slug=agent.slug, query=query, api_key=None).run
    run_execute(run_id=str(run.id))
    return Run.objects.get(pk=run.id)


def team_rule(agent: Agent, server: McpServer) -> None:
    """A rule that calls ``lookup`` with the name the question gives, as the version froze it."""
    DeterministicRule.objects.create(
        agent=agent,
        name="팀 조회",
        server=server,
        tool_name="lookup",
        params={"name": "{match.who}"},
        when={"regex": r"(?P<who>\S+) 님은"},
    )


def offered(model: ScriptedOpenAIServer) -> dict[str, Any]:
    """The tools the run's first model call was offered, by name → their parameters."""
    tools = model.requests[0]["body"].get("tools") or []
    return {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}


@pytest.mark.slow
def test_a_published_version_is_not_offered_a_tool_whose_arguments_changed_and_its_trace_says_why(
    admin_user, caplog
) -> None:
    server = stale_contract_server()
    turns = [
        {"tool_calls": [{"name": "lookup", "args": {"full_name": "박도윤"}}]},
        {"content": "r: {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as model:
        agent = openai_agent(model, server, slug="stale-live")
        version = published(agent, admin_user)
        rename_lookups_argument(server, admin_user)
        with caplog.at_level(logging.WARNING, logger="agents.engine"):
            run = run_of(agent, "박도윤 님은 어느 팀인가요?")

    assert run.version_id == version.pk
    assert list(offered(model)) == ["list_teams"]  # lookup is left out; the unchanged tool is still offered
    [note] = [entry for entry in run.messages if entry.get("type") == "tool_left_out"]
    assert (note["mcp_id"], note["tool"]) == ("stale", "lookup")
    assert note["message"] == (
        "Tool lookup of server stale is left out: the contract v1 froze for it does not fit the arguments its "
        "server lists now. Fit the tool's contract and publish the agent again."
    )
    assert any(
        "lookup" in r.getMessage() and "v1" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"
    )
    # The model's call of the tool it was not offered is refused as unknown, never checked against the frozen
    # contract and answered "did you mean 'name'?", an argument the server no longer takes.
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert call.reason == "tool:unknown"
    assert "'name'" not in run.answer
    # The run's page says so in its reader's words, not as a raw trace entry.
    [step] = [s for s in run_timeline(run) if s.label == "tool left out"]
    assert (step.title, step.status_text) == ("lookup", "not offered") and "the contract v1 froze" in step.note


@pytest.mark.slow
def test_a_draft_run_is_offered_the_contract_fitted_to_the_new_arguments(admin_user) -> None:
    server = stale_contract_server("stale-draft")
    turns = [
        {"tool_calls": [{"name": "lookup", "args": {"full_name": "박도윤"}}]},
        {"content": "r: {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as model:
        agent = openai_agent(model, server, slug="stale-draft")
        rename_lookups_argument(server, admin_user)
        run = run_of(agent, "박도윤 님은 어느 팀인가요?")

    assert run.version_id is None
    assert offered(model)["lookup"]["required"] == ["full_name"]
    assert list(offered(model)["lookup"]["properties"]) == ["full_name"]
    assert not [entry for entry in run.messages if entry.get("type") == "tool_left_out"]
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert call.ok and run.answer == "r: " + tool_data_block("박도윤: 물류플랫폼팀")


@pytest.mark.slow
def test_the_version_page_warns_of_the_tools_whose_arguments_changed_until_the_agent_is_published_again(
    admin_user,
) -> None:
    server = stale_contract_server("stale-page")
    agent = make_agent(slug="stale-page", servers=[server], with_demo_rules=False)
    first = published(agent, admin_user)
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(admin_user)

    def page(version: AgentVersion) -> str:
        url = reverse("admin:agents_agentversion_change", args=[version.pk])
        response = client.get(url)
        assert response.status_code == 200
        return response.content.decode()

    warning = "the contracts v1 froze for stale-page/lookup do not fit the arguments their servers list now"
    assert warning not in page(first)

    rename_lookups_argument(server, admin_user)
    assert version_stale_tools(first.content) == ["stale-page/lookup"]
    shown = page(first)
    assert warning in shown
    assert "Runs of v1 are not offered these tools; fit their contracts and publish the agent again." in shown

    second = published(Agent.objects.get(pk=agent.pk), admin_user)
    assert version_stale_tools(second.content) == []
    assert "do not fit the arguments their servers list now" not in page(second)


@pytest.mark.slow
def test_a_published_versions_rule_does_not_send_the_old_arguments_to_a_tool_whose_arguments_changed(
    admin_user,
) -> None:
    """The model is not offered the tool; a rule of the version (and a flow node, through the same gate) called it
    with the arguments the version froze, checked against the frozen contract: the old ``name`` passed the gate
    and reached a server that takes ``full_name`` now (a write would have been sent what its server no longer
    takes). The gate refuses it, ``tool:out_of_date``, before anything is sent; the agent's A2A card no longer
    lists it either."""
    from agents.api.a2a_server import agent_served, agent_skills

    server = stale_contract_server("stale-rule")
    agent = make_agent(slug="stale-rule", servers=[server], with_demo_rules=False)
    team_rule(agent, server)
    published(agent, admin_user)
    rename_lookups_argument(server, admin_user)

    run = run_of(agent, "박도윤 님은 어느 팀인가요?")

    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason, call.attempt) == (False, "tool:out_of_date", 0)  # refused: nothing was sent
    [result] = [m for m in run.messages if m.get("type") == "deterministic_call"]
    assert result["error"] == "tool:out_of_date" and "publish the agent again" in result["message"]
    skills = [skill["name"] for skill in agent_skills(agent_served(Agent.objects.get(pk=agent.pk)))]
    assert "lookup" not in skills and "list_teams" in skills


@pytest.mark.slow
def test_a_published_versions_rule_whose_arguments_still_fit_calls_the_changed_tool(admin_user) -> None:
    """The server dropped an optional argument the rule never sends (``limit``): the frozen contract no longer fits
    the tool's list, but the call does. It goes out as before (every such rule was refused ``tool:out_of_date``
    until the agent was published again)."""
    server = stale_contract_server("stale-optional")
    McpServer.objects.filter(pk=server.pk).update(env={"LOOKUP_ARG": "name_limit"})
    server.refresh_from_db()
    get_default_pool().close(server.mcp_id)
    assert mcp_server_discover(server=server, actor="test", via="tests").ok
    tool = McpTool.objects.get(server=server, name="lookup")
    if tool.review_required:
        assert mcp_tool_review_approve(tool=tool, actor=admin_user, via="tests")
    assert "limit" in ToolContract.objects.get(tool=tool).args
    agent = make_agent(slug="stale-optional", servers=[server], with_demo_rules=False)
    team_rule(agent, server)
    published(agent, admin_user)
    server.env = {"LOOKUP_ARG": "name"}  # limit dropped
    server.save()
    get_default_pool().close(server.mcp_id)
    assert mcp_server_discover(server=server, actor="test", via="tests").ok
    tool = McpTool.objects.get(server=server, name="lookup")
    assert tool.review_required and mcp_tool_review_approve(tool=tool, actor=admin_user, via="tests")
    assert version_stale_tools(Agent.objects.get(pk=agent.pk).live_version.content) == ["stale-optional/lookup"]

    run = run_of(agent, "박도윤 님은 어느 팀인가요?")

    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason) == (True, "")
