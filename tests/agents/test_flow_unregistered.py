"""A flow graph taken out of ``PLATFORM_FLOW_GRAPHS`` no longer runs.

An agent is saved only with a registered graph (``Agent._clean_flow_graph_registered``), but the worker ran
whatever its stored agent or version named: an operator who took a graph out of the list, to stop trusting its
code, still had it imported and run by every run of an agent saved before. The run now fails as ``flow:error``
naming the graph and the registered ones, and the graph's builder is never called; a roll back to a version
with such a graph is refused."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_version_publish, agent_version_rollback
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_flow_defects import greets, one_node, run
from tests.conftest import make_agent

built_runs: list[str] = []  # the runs whose graph this module's builder built


def build_recorded(settings: Any) -> Any:
    built_runs.append(str(settings.run_id))
    return one_node(greets)(settings)


GRAPH = f"{__name__}.build_recorded"


def saved_flow_agent(slug: str) -> Agent:
    server = McpServer.objects.create(mcp_id="unused", name="unused", command="true")
    agent = make_agent(slug=slug, servers=[server], with_demo_rules=False)
    agent.mode = Agent.Mode.FLOW
    agent.flow_graph = GRAPH
    agent.full_clean()  # as every path that saves one: registered now
    agent.save()
    return agent


@pytest.mark.django_db
def test_an_agent_s_graph_taken_out_of_the_list_fails_its_runs_without_being_built(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [GRAPH]
    agent = saved_flow_agent("flow-unregistered")
    ran = run(agent, "안녕하세요")
    assert (ran.status, ran.answer) == (Run.Status.SUCCEEDED, "hello")
    assert built_runs == [str(ran.id)]

    settings.PLATFORM_FLOW_GRAPHS = []
    refused = run(agent, "안녕하세요")
    assert (refused.status, refused.error_code) == (Run.Status.FAILED, "flow:error")
    assert f"플로우 그래프 '{GRAPH}'은(는) 등록되어 있지 않습니다" in refused.error_message  # the workers' language
    assert "agents.flows.sequential.build_graph" in refused.error_message  # what is registered
    assert built_runs == [str(ran.id)]  # never built for the refused run


@pytest.mark.django_db
def test_a_live_version_s_frozen_graph_taken_out_of_the_list_fails_its_runs(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [GRAPH]
    agent = saved_flow_agent("flow-unregistered-version")
    published = agent_version_publish(agent=agent, actor="t", via="tests")
    # The agent's own row moves on to a shipped template: a run of the version still runs its frozen graph.
    Agent.objects.filter(pk=agent.pk).update(flow_graph="agents.flows.sequential.build_graph")
    built_runs.clear()

    settings.PLATFORM_FLOW_GRAPHS = []
    refused = Run.objects.create(agent=agent, version=published, query="q")
    run_execute(run_id=str(refused.id))
    refused.refresh_from_db()
    assert (refused.status, refused.error_code) == (Run.Status.FAILED, "flow:error")
    assert f"플로우 그래프 '{GRAPH}'은(는) 등록되어 있지 않습니다" in refused.error_message  # the workers' language
    assert built_runs == []


@pytest.mark.django_db
def test_a_roll_back_to_a_version_whose_graph_is_no_longer_registered_is_refused_naming_it(
    settings: Any, admin_client: Client
) -> None:
    """A roll back published the old content again unchecked (an imported version is checked): its runs would
    all fail. The service, the admin's action and the command refuse it, naming the graph; nothing is published."""
    settings.PLATFORM_FLOW_GRAPHS = [GRAPH]
    agent = saved_flow_agent("flow-unregistered-rollback")
    v1 = agent_version_publish(agent=agent, actor="t", via="tests")
    Agent.objects.filter(pk=agent.pk).update(
        flow_graph="agents.flows.sequential.build_graph", model_params={"flow": {"mcp_id": "unused"}}
    )
    agent.refresh_from_db()
    v2 = agent_version_publish(agent=agent, actor="t", via="tests")
    settings.PLATFORM_FLOW_GRAPHS = []
    published = AuditEvent.objects.filter(action="config.agent_version.publish").count()

    with pytest.raises(ValidationError) as refused:
        agent_version_rollback(version=v1, actor="t", via="tests")
    assert any(GRAPH in message for message in refused.value.messages), refused.value.messages

    page = admin_client.post(
        "/admin/agents/agentversion/", {"action": "rollback", "_selected_action": [v1.pk]}, follow=True
    )
    told = [str(m) for m in get_messages(page.wsgi_request)]
    assert len(told) == 1 and f"v{v1.number} cannot be published again" in told[0] and GRAPH in told[0], told

    with pytest.raises(CommandError, match=GRAPH):
        call_command("agent_version", "rollback", agent.slug, str(v1.number), stdout=io.StringIO())

    agent.refresh_from_db()
    assert agent.live_version == v2
    assert AuditEvent.objects.filter(action="config.agent_version.publish").count() == published
