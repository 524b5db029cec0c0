"""A version's frozen content is checked as the agent's own settings, rules and contracts are when they are saved:
a run takes a version's values as they are. An imported version used to be stored unchecked: its base URL got
the agent's model key whatever the address policy said, and a wrong type failed every run as ``internal``. A
stored version whose base URL the policy refuses now (published before it changed) sends nothing either."""

from __future__ import annotations

import copy

import pytest

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.execution import run_execute
from agents.models import Run
from agents.services import agent_version_publish
from agents.versions import version_content_portable
from tests.agents.test_openai_compatible import openai_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db


def document_with_version(agent, content, number: int = 7) -> dict:
    return {
        "agents": [
            {
                "slug": agent.slug,
                "servers": [s.mcp_id for s in agent.servers.all()],
                "model": {
                    "provider": agent.model_provider,
                    "model_id": agent.model_id,
                    "params": agent.model_params,
                    "secrets": {"api_key": {"set": True}} if agent.model_secrets else {},
                },
                "versions": [{"number": number, "content": content}],
                "live_version": number,
            }
        ]
    }


def test_an_imported_version_whose_model_address_the_policy_refuses_is_refused(demo_server, settings) -> None:
    with ScriptedOpenAIServer([{"content": "hi"}]).running() as server:
        agent = openai_agent(server, demo_server)
        published = agent_version_publish(agent=agent, actor="t", via="tests")
        content = copy.deepcopy(version_content_portable(published.content))
        agent.model_params = {**agent.model_params, "base_url": "https://llm.example.com/v1"}
        agent.save()
        settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS = []  # the 127.0.0.1 of the version: an internal host

        with pytest.raises(ApplicationError) as refused:
            config_import(actor="t", document=document_with_version(agent, content))
        assert "versions: v7: agent.model_params:" in str(refused.value)

        # The version published before the policy changed sends nothing either.
        run = Run.objects.create(agent=agent, query="안녕", version=published)
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert (run.status, run.error_code) == (Run.Status.FAILED, "model:unavailable")
        assert server.requests == []


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ("agent.max_iterations", "many", "agent.max_iterations"),
        ("agent.model_params", "not an object", "agent.model_params"),
        ("agent.flow_graph", "agents.flows.nowhere.build_graph", "agent.flow_graph"),
        ("rule.when", "not an object", ".when"),
        ("rule.params", ["x"], ".params"),
        ("contract.timeout_s", "slow", ".timeout_s"),
        ("contract.args", "x", ".args"),
    ],
)
def test_an_imported_version_with_values_no_run_could_use_is_refused(demo_agent, where, value, named) -> None:
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(version_content_portable(published.content))
    part, _dot, name = where.partition(".")
    if part == "agent":
        content["agent"][name] = value
        if name == "flow_graph":
            content["agent"]["mode"] = "flow"
    elif part == "rule":
        rule = next(r for r in content["rules"] if not r.get("code"))
        rule[name] = value
    else:
        content["contracts"][next(iter(content["contracts"]))][name] = value
    demo_agent.model_secrets = {}

    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document_with_version(demo_agent, content))

    assert "versions: v7: " in str(refused.value) and named in str(refused.value)
    assert not demo_agent.versions.filter(number=7).exists()


def test_a_version_as_published_imports(demo_agent) -> None:
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(version_content_portable(published.content))
    config_import(actor="t", document=document_with_version(demo_agent, content))
    assert demo_agent.versions.get(number=7).content["agent"] == published.content["agent"]
