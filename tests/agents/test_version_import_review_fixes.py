"""An imported version and a flow agent's servers, checked as the agent's own settings and rules are.

- A secret in a version's frozen rule params was accepted on import, then stored, shown on the version's page and
  exported in clear; a live rule's are refused. A frozen rule naming no server or tool, or with an empty keyword
  (it matched every query), was taken too.
- A flow agent's server was checked against the servers bound before the save (a new agent: every registered
  one): an import entry, an ``agent_update`` call or the admin's form that bound others in the same save was
  accepted, and every run failed ``flow:error``."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent, AgentVersion
from agents.services import agent_create, agent_update, agent_version_publish, version_content_problems
from mcpregistry.models import McpServer
from tests.agents.test_agent_form import agent_post

pytestmark = pytest.mark.django_db

SECRET = "sk-live-abcdefghijklmnopqrstu"
SEQUENTIAL = "agents.flows.sequential.build_graph"
NOT_CALLABLE = "flow.mcp_id: 'docs' is not a server this agent can call; choose one of: sds-company-data"


def refusal(document: dict[str, Any]) -> str:
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)
    return refused.value.message


def exported_with_a_copy_of_v1(agent: Agent, change: Any) -> dict[str, Any]:
    """The export of ``agent`` (published as v1) with a copy of v1 as v9, changed by ``change(content)``."""
    agent_version_publish(agent=agent, actor="t", via="tests")
    document = config_export()
    entry = next(a for a in document["agents"] if a["slug"] == agent.slug)
    copied = copy.deepcopy(entry["versions"][0])
    copied["number"] = 9
    change(copied["content"])
    entry["versions"].append(copied)
    return document


# ---- 1. An imported version's frozen rules --------------------------------------------------------------------------


def test_an_imported_version_whose_rule_params_hold_a_secret_is_refused_naming_where(demo_agent: Agent) -> None:
    document = exported_with_a_copy_of_v1(
        demo_agent, lambda content: content["rules"][0]["params"].update(api_key=SECRET)
    )
    message = refusal(document)
    rule = AgentVersion.objects.get(agent=demo_agent, number=1).content["rules"][0]["name"]
    assert f"agents[0] (company-assistant): versions: v9: rules[0] ({rule}).params: This holds a secret" in message
    assert "stored, shown and exported in clear" in message
    assert SECRET not in message
    assert not AgentVersion.objects.filter(agent=demo_agent, number=9).exists()


def test_a_placeholder_in_a_version_s_rule_params_is_no_secret(demo_agent: Agent) -> None:
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(published.content)
    content["rules"][0]["params"]["token"] = "Bearer {context.token}"
    assert not [p for p in version_content_problems(agent=demo_agent, content=content) if ".params:" in p]


@pytest.mark.parametrize(
    ("change", "told"),
    [
        (lambda rule: rule.update(mcp_id=""), ".mcp_id: Choose the server"),
        (lambda rule: rule.update(tool_name=""), ".tool_name: Name the tool to call"),
        (lambda rule: rule["when"].update(any_keywords=["소속", " "]), ".when: any_keywords: an empty keyword"),
    ],
    ids=["no-server", "no-tool", "empty-keyword"],
)
def test_a_version_s_rule_that_its_runs_could_not_use_is_refused(demo_agent: Agent, change: Any, told: str) -> None:
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(published.content)
    change(content["rules"][0])
    problems = version_content_problems(agent=demo_agent, content=content)
    assert any(p.startswith("rules[0] (") and told in p for p in problems), problems


def test_an_installation_s_own_published_version_has_no_problem(demo_agent: Agent) -> None:
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    assert version_content_problems(agent=demo_agent, content=published.content) == []


@pytest.mark.parametrize(
    ("model", "told"),
    [
        ({"model_params": {"api_key": SECRET}}, "A key is a secret"),
        (
            {
                "model_provider": "openai_compatible",
                "model_id": "m",
                "model_params": {"base_url": f"https://api.example.com/v1?api_key={SECRET}"},
            },
            "base_url is stored, shown and exported in clear",
        ),
    ],
    ids=["model-params", "base-url"],
)
def test_a_secret_in_a_version_s_agent_settings_is_refused_as_the_agent_s_is(
    demo_agent: Agent, model: dict[str, Any], told: str
) -> None:
    document = exported_with_a_copy_of_v1(demo_agent, lambda content: content["agent"].update(model))
    message = refusal(document)
    assert "versions: v9: agent.model_params: " in message and told in message, message
    assert SECRET not in message


# ---- 2. A flow agent's server, against the servers the same save binds -------------------------------------------


@pytest.fixture
def docs() -> McpServer:
    return McpServer.objects.create(
        mcp_id="docs", name="docs", transport="streamable_http", url="http://127.0.0.1:9/mcp"
    )


def flow_agent_calling_docs(demo_server: McpServer, docs: McpServer) -> Agent:
    data = {"slug": "flowy", "name": "flowy", "mode": "flow", "flow_graph": SEQUENTIAL}
    data["model_params"] = {"flow": {"mcp_id": "docs"}}
    return agent_create(actor="t", via="tests", data=data, servers=[demo_server, docs])


def test_a_new_flow_agent_calling_a_server_its_entry_does_not_bind_is_refused(
    demo_server: McpServer, docs: McpServer
) -> None:
    entry = {"slug": "flowy", "servers": ["sds-company-data"], "mode": "flow", "flow_graph": SEQUENTIAL}
    entry["model"] = {"provider": "offline", "params": {"flow": {"mcp_id": "docs"}}}
    message = refusal({"agents": [entry]})
    assert f"agents[0] (flowy): model_params: {NOT_CALLABLE}" in message, message
    assert not Agent.objects.filter(slug="flowy").exists()


def test_a_new_flow_agent_is_checked_against_the_servers_it_is_created_with(
    demo_server: McpServer, docs: McpServer
) -> None:
    data = {"slug": "flowy", "name": "flowy", "mode": "flow", "flow_graph": SEQUENTIAL}
    data["model_params"] = {"flow": {"mcp_id": "docs"}}
    with pytest.raises(ValidationError) as refused:
        agent_create(actor="t", via="tests", data=data, servers=[demo_server])
    assert refused.value.message_dict["model_params"] == [NOT_CALLABLE]


def test_unbinding_the_server_the_flow_calls_is_refused(demo_server: McpServer, docs: McpServer) -> None:
    agent = flow_agent_calling_docs(demo_server, docs)
    with pytest.raises(ValidationError) as refused:
        agent_update(agent=Agent.objects.get(pk=agent.pk), actor="t", via="tests", servers=[demo_server])
    assert refused.value.message_dict["model_params"] == [NOT_CALLABLE]
    message = refusal({"agents": [{"slug": "flowy", "servers": ["sds-company-data"]}]})
    assert f"agents[0] (flowy): model_params: {NOT_CALLABLE}" in message, message
    assert sorted(agent.servers.values_list("mcp_id", flat=True)) == ["docs", "sds-company-data"]


def test_the_flow_s_server_and_the_binding_change_together(demo_server: McpServer, docs: McpServer) -> None:
    agent = flow_agent_calling_docs(demo_server, docs)
    data = {"model_params": {"flow": {"mcp_id": "sds-company-data"}}}
    agent_update(agent=agent, actor="t", via="tests", data=data, servers=[demo_server])
    assert list(agent.servers.values_list("mcp_id", flat=True)) == ["sds-company-data"]


def test_a_flow_whose_server_was_unbound_elsewhere_still_saves_with_its_binding_kept(
    demo_server: McpServer, docs: McpServer
) -> None:
    """A server unbound by another change (here straight in the table, as a delete of it would) does not make
    every other save of the agent fail, the admin's included (it posts the same servers)."""
    agent = flow_agent_calling_docs(demo_server, docs)
    agent.servers.remove(docs)
    agent_update(agent=agent, actor="t", via="tests", data={"system_prompt": "바뀜"}, servers=[demo_server])
    agent_update(agent=agent, actor="t", via="tests", data={"system_prompt": "또 바뀜"})
    assert Agent.objects.get(pk=agent.pk).system_prompt == "또 바뀜"


def admin_page_errors(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))


def test_the_admin_form_refuses_unbinding_the_server_the_flow_calls(
    admin_client: Client, demo_server: McpServer, docs: McpServer
) -> None:
    agent = flow_agent_calling_docs(demo_server, docs)
    post = agent_post(
        slug="flowy",
        name="flowy",
        mode="flow",
        flow_graph=SEQUENTIAL,
        model_params='{"flow": {"mcp_id": "docs"}}',
        servers=[str(demo_server.pk)],
    )
    response = admin_client.post(f"/admin/agents/agent/{agent.pk}/change/", post)
    assert response.status_code == 200
    assert "&#x27;docs&#x27; is not a server this agent can call" in admin_page_errors(response.content.decode())
    assert sorted(agent.servers.values_list("mcp_id", flat=True)) == ["docs", "sds-company-data"]


def test_the_admin_form_checks_a_new_flow_agent_against_the_servers_ticked(
    admin_client: Client, demo_server: McpServer
) -> None:
    """The template calls the default server (PLATFORM_FLOW_DEFAULT_MCP_ID): registered is not enough, the agent
    must bind it (its runs bind only its servers)."""
    post = agent_post(mode="flow", flow_graph=SEQUENTIAL)
    response = admin_client.post("/admin/agents/agent/add/", post)
    assert "the flow calls the default server &#x27;sds-company-data&#x27;" in admin_page_errors(
        response.content.decode()
    )
    response = admin_client.post("/admin/agents/agent/add/", {**post, "servers": [str(demo_server.pk)]})
    assert response.status_code == 302
    assert list(Agent.objects.get(slug="flowing").servers.values_list("mcp_id", flat=True)) == ["sds-company-data"]


# ---- What only a tool can say of a frozen contract --------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "told"),
    [
        ({"idempotency_arg": "request_ref"}, ".idempotency_arg: 'request_ref' is not an argument of"),
        ({"fallback_tool": "SELF"}, ".fallback_tool: A tool cannot be its own fallback"),
    ],
    ids=["untaken-key", "own-fallback"],
)
def test_an_imported_versions_contract_is_checked_against_the_tool_here(
    demo_agent: Agent, change: dict[str, str], told: str
) -> None:
    """The frozen contract has no tool, and the checks that need one were skipped: a version naming an idempotency
    argument its tool does not take was imported and made live, and every unanswered send of its approved write
    went out again (a server ignoring the unknown key wrote three times). Checked against the tool of that name
    here, and refused naming where, as the contract's own entry is."""
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(published.content)
    key = next(iter(content["contracts"]))
    tool = key.partition("/")[2]
    content["contracts"][key].update({name: tool if value == "SELF" else value for name, value in change.items()})
    problems = version_content_problems(agent=demo_agent, content=content)
    assert any(p.startswith(f"contracts.{key}") and told in p for p in problems), problems
    assert not [p for p in version_content_problems(agent=demo_agent, content=content, stored_here=True) if told in p]
