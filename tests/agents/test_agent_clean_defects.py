"""``Agent.clean`` refuses two settings it accepted, each of which broke every run or leaked a secret:

- An OpenAI-compatible ``base_url`` holding what the audit hides as a secret (``?api_key=sk-…``) was accepted (only
  a user and password were refused), stored, shown and written in clear by ``export_config``. An MCP server's URL
  was already refused so (``McpServer.clean``); a stored one still saves as it is.
- A flow agent whose options name no server, with a shipped template as its graph, calls the templates' default
  server (``PLATFORM_FLOW_DEFAULT_MCP_ID``): an agent that could not call it passed validation and every run failed
  ``flow:error`` ("MCP '…'의 tool이 로드되지 않음"). It is refused naming ``flow.mcp_id`` and the servers to choose."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent
from agents.services import agent_update
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_configuration import document

pytestmark = pytest.mark.django_db

KEY = "sk-live-9f8e7d6c5b4a3f2e1d0c"
KEYED_URL = f"https://llm.example.com/v1?api_key={KEY}"


@pytest.fixture(autouse=True)
def _docs_token_may_be_passed_through(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["DOCS_TOKEN"]


def openai_agent(base_url: str) -> Agent:
    return Agent(
        slug="llm", name="llm", model_provider="openai_compatible", model_id="m", model_params={"base_url": base_url}
    )


# --- 1. a secret in the model's base URL -----------------------------------------------------------------------


def test_a_base_url_holding_an_api_key_is_refused_naming_where_the_key_goes() -> None:
    agent = openai_agent(KEYED_URL)
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    [problem] = refused.value.message_dict["model_params"]
    assert "base_url" in problem and "the model API key" in problem
    assert KEY not in problem
    openai_agent("https://llm.example.com/v1").full_clean()  # the URL alone is fine


def test_a_base_url_holding_an_api_key_stored_before_the_check_still_saves() -> None:
    agent = openai_agent("https://llm.example.com/v1")
    agent.save()
    Agent.objects.filter(pk=agent.pk).update(model_params={"base_url": KEYED_URL})
    agent.refresh_from_db()
    agent.name = "renamed"
    agent.full_clean()  # unchanged, it is not checked again; changed to another such URL, it is
    agent.model_params = {"base_url": KEYED_URL + "x"}
    with pytest.raises(ValidationError):
        agent.full_clean()


def test_the_import_refuses_a_base_url_holding_an_api_key_and_the_export_never_writes_it() -> None:
    doc = document()
    doc["agents"].append(
        {
            "slug": "local-llm",
            "servers": [],
            "model": {"provider": "openai_compatible", "model_id": "qwen2.5:7b", "params": {"base_url": KEYED_URL}},
        }
    )
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=doc)
    assert "agents[1] (local-llm)" in refused.value.message and "base_url" in refused.value.message
    assert not Agent.objects.filter(slug="local-llm").exists()
    assert not AuditEvent.objects.exists()
    assert KEY not in json.dumps(config_export(), ensure_ascii=False)


# --- 2. a flow template's default server -----------------------------------------------------------------------


def server(mcp_id: str) -> McpServer:
    return McpServer.objects.create(
        mcp_id=mcp_id, name=mcp_id, transport=McpServer.Transport.STREAMABLE_HTTP, url="http://127.0.0.1:9/mcp"
    )


def react_agent(*servers: McpServer) -> Agent:
    agent = Agent.objects.create(slug="hr-flow", name="인사 흐름")
    agent.servers.set(servers)
    return agent


def as_flow(agent: Agent, graph: str = "agents.flows.sequential.build_graph") -> Agent:
    agent.mode, agent.flow_graph = Agent.Mode.FLOW, graph
    return agent


def test_a_template_flow_with_no_server_named_must_bind_the_default_server() -> None:
    server("sds-company-data")
    agent = as_flow(react_agent(server("hr-data")))
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    [problem] = refused.value.message_dict["model_params"]
    assert problem.startswith("flow.mcp_id: ") and "'sds-company-data'" in problem
    assert problem.endswith("choose one of: hr-data")
    agent.model_params = {"flow": {"mcp_id": "hr-data"}}  # the fix the message points to
    agent.full_clean()


def test_a_flow_of_an_agent_that_binds_no_server_is_told_to_bind_one() -> None:
    agent = as_flow(react_agent())
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    [problem] = refused.value.message_dict["model_params"]
    assert problem.endswith("choose one of: none: bind a server to this agent first"), problem  # it ended "—"


@pytest.mark.parametrize("graph", ["agents.flows.parallel.build_graph", "agents.flows.http_pipeline.build_graph"])
def test_every_template_is_checked_and_the_service_refuses_it_too(graph: str) -> None:
    agent = as_flow(react_agent(server("hr-data")), graph)
    with pytest.raises(ValidationError) as refused:
        agent_update(agent=agent, actor="t", via="tests")
    assert "flow.mcp_id: " in str(refused.value)
    assert Agent.objects.get(pk=agent.pk).mode == Agent.Mode.REACT


def test_a_template_flow_bound_to_the_default_server_saves(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_FLOW_DEFAULT_MCP_ID = "hr-data"
    as_flow(react_agent(server("hr-data"), server("docs"))).full_clean()


def test_a_flow_of_its_own_is_not_held_to_the_templates_default(settings: Any) -> None:
    # It names the servers it calls itself: the default is the templates'.
    settings.PLATFORM_FLOW_GRAPHS = ["tests.agents.test_flow_defects.build_greets"]
    agent = as_flow(react_agent(server("hr-data")), "tests.agents.test_flow_defects.build_greets")
    agent.full_clean()


def test_the_import_refuses_a_template_flow_that_could_not_call_the_default_server() -> None:
    doc = document()
    doc["agents"][0].update(mode="flow", flow_graph="agents.flows.sequential.build_graph")
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=doc)
    assert "agents[0] (assistant)" in refused.value.message
    assert "flow.mcp_id: " in refused.value.message and "sds-company-data" in refused.value.message
    assert not Agent.objects.exists()
    doc["agents"][0]["model"]["params"] = {"flow": {"mcp_id": "company"}}
    config_import(actor="t", document=doc)
    assert Agent.objects.get(slug="assistant").mode == Agent.Mode.FLOW
