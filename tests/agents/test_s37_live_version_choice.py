"""What live traffic, an A/B arm or a shadow runs is a version that can run, and a published agent always has one.

Defects held here:

- clearing a published agent's live version (the agent page's empty choice, ``agent_update(data={"live_version":
  None})``, an imported document's ``"live_version": null``) put the stored, unpublished draft on live traffic at
  once, its runs recording ``version: null`` ("never published"), with the usual success message;
- a roll back to a version whose content can no longer run (a flow graph taken out of ``PLATFORM_FLOW_GRAPHS``) was
  refused, but the same version was accepted as the live version, as an arm's or as the shadow's, and every run of
  it failed ``flow:error``;
- the A/B results page offered no agent once its arms were deleted, although its runs still carried their arm."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent, AgentArm, AgentVersion, DeterministicRule
from agents.services import (
    agent_arm_create,
    agent_arm_delete,
    agent_arm_update,
    agent_shadow_set,
    agent_update,
    agent_version_publish,
    api_key_create,
    deterministic_rule_update,
    run_create,
)
from mcpregistry.models import McpServer
from tests.agents.test_configuration_versions import agent_entry, with_secrets
from tests.agents.test_fix_publish_on_save_rules import agent_page
from tests.agents.test_flow_unregistered import GRAPH, saved_flow_agent
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

OTHER = "tests.agents.test_flow_defects.build_greets"  # the graph the agent moved on to, still registered
CLEARING = "Without a live version, live traffic would run the unpublished draft"


def refused_fields(exc: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return exc.value.message_dict


def page_errors(response: Any) -> dict[str, list[str]]:
    """The field errors of the admin page a refused post shows again (no redirect: nothing was saved)."""
    assert not response.redirect_chain and response.status_code == 200
    return {name: list(errors) for name, errors in response.context["adminform"].form.errors.items()}


# --- a published agent keeps a live version -------------------------------------------------------------------


def published_with_a_draft(agent: Agent) -> AgentVersion:
    """v1 live, then a rule edited: the stored draft is not v1."""
    v1 = agent_version_publish(agent=agent, actor="t", via="tests")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"answer_template": "검토 전 {result.asset_id}"})
    agent.refresh_from_db()
    return v1


def test_clearing_a_published_agents_live_version_is_refused_and_live_traffic_keeps_it(demo_agent: Agent) -> None:
    v1 = published_with_a_draft(demo_agent)
    with pytest.raises(ValidationError) as refused:
        agent_update(agent=demo_agent, actor="t", via="tests", data={"live_version": None})
    assert CLEARING in refused_fields(refused)["live_version"][0]
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1
    run = run_create(agent_slug=demo_agent.slug, query="A-1001 자산의 현재 상태를 알려주세요.", api_key=None)
    assert run.version == v1  # not the draft, recorded as never published


def test_an_agent_never_published_keeps_its_live_version_empty(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"live_version": None, "name": "자산 도우미"})
    demo_agent.refresh_from_db()
    assert (demo_agent.live_version, demo_agent.name) == (None, "자산 도우미")


def test_the_agent_page_refuses_an_empty_live_version_at_its_field(admin_client: Client, demo_agent: Agent) -> None:
    v1 = published_with_a_draft(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted["live_version"] = [""]  # the "---------" choice
    response = admin_client.post(url, posted, follow=True)
    assert CLEARING in page_errors(response)["live_version"][0]
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1


def test_an_import_giving_a_published_agent_no_live_version_is_refused_naming_the_entry(demo_agent: Agent) -> None:
    v1 = published_with_a_draft(demo_agent)
    document = with_secrets(config_export())
    entry = agent_entry(document)
    entry.update(live_version=None, publish_on_save=False)
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)
    assert f"(company-assistant): live_version: {CLEARING}" in refused.value.message
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1


# --- a version that can no longer run is not chosen -----------------------------------------------------------


@pytest.fixture
def graph_gone(settings: Any) -> tuple[Agent, AgentVersion, AgentVersion]:
    """A flow agent's v1 runs ``GRAPH``, its v2 (live) ``OTHER``; then ``GRAPH`` is taken out of the list, so v1
    can no longer run (a roll back to it is refused). Returns (agent, v1, v2)."""
    settings.PLATFORM_FLOW_GRAPHS = [GRAPH, OTHER]
    agent = saved_flow_agent("flow-gone")
    v1 = agent_version_publish(agent=agent, actor="t", via="tests")
    agent_update(agent=agent, actor="t", via="tests", data={"flow_graph": OTHER})
    v2 = agent_version_publish(agent=agent, actor="t", via="tests")
    settings.PLATFORM_FLOW_GRAPHS = [OTHER]
    agent.refresh_from_db()
    assert agent.live_version == v2
    return agent, v1, v2


def assert_names_the_graph(messages: list[str], version: AgentVersion) -> None:
    assert any(f"v{version.number} can no longer run" in m and GRAPH in m for m in messages), messages


def test_a_version_that_can_no_longer_run_is_refused_as_the_live_version(graph_gone: Any) -> None:
    agent, v1, v2 = graph_gone
    with pytest.raises(ValidationError) as refused:
        agent_update(agent=agent, actor="t", via="tests", data={"live_version": v1})
    assert_names_the_graph(refused_fields(refused)["live_version"], v1)
    agent.refresh_from_db()
    assert agent.live_version == v2


def test_the_agent_page_refuses_it_at_the_live_version_and_shadow_fields(graph_gone: Any, admin_client: Client) -> None:
    agent, v1, v2 = graph_gone
    url, posted = agent_page(admin_client, agent)
    posted["live_version"] = [str(v1.pk)]
    posted["shadow_version"] = [str(v1.pk)]
    errors = page_errors(admin_client.post(url, posted, follow=True))
    assert_names_the_graph(errors["live_version"], v1)
    assert_names_the_graph(errors["shadow_version"], v1)
    agent.refresh_from_db()
    assert (agent.live_version, agent.shadow_version) == (v2, None)


def test_a_version_that_can_no_longer_run_is_refused_as_the_shadow(graph_gone: Any) -> None:
    agent, v1, _ = graph_gone
    with pytest.raises(ValidationError) as refused:
        agent_shadow_set(agent=agent, actor="t", via="tests", version=v1, rate=0.5)
    assert_names_the_graph(refused_fields(refused)["shadow_version"], v1)
    agent.refresh_from_db()
    assert (agent.shadow_version, agent.shadow_sample_rate) == (None, 0.0)


def test_a_version_that_can_no_longer_run_is_refused_as_an_arms(graph_gone: Any, admin_client: Client) -> None:
    agent, v1, v2 = graph_gone
    with pytest.raises(ValidationError) as refused:
        agent_arm_create(actor="t", via="tests", data={"agent": agent, "name": "b", "version": v1, "weight": 1})
    assert_names_the_graph(refused_fields(refused)["version"], v1)
    arm = agent_arm_create(actor="t", via="tests", data={"agent": agent, "name": "a", "version": v2, "weight": 1})
    with pytest.raises(ValidationError) as moved:
        agent_arm_update(arm=arm, actor="t", via="tests", data={"version": v1})
    assert_names_the_graph(refused_fields(moved)["version"], v1)

    posted = {"agent": agent.pk, "name": "b", "version": v1.pk, "weight": "1"}
    errors = page_errors(admin_client.post("/admin/agents/agentarm/add/", posted, follow=True))
    assert_names_the_graph(errors["version"], v1)
    assert list(AgentArm.objects.values_list("name", "version__number")) == [("a", 2)]


def test_an_arm_or_agent_whose_version_went_bad_meanwhile_still_saves_its_other_fields(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [GRAPH, OTHER]
    agent = saved_flow_agent("flow-went-bad")
    v1 = agent_version_publish(agent=agent, actor="t", via="tests")
    arm = agent_arm_create(actor="t", via="tests", data={"agent": agent, "name": "a", "version": v1, "weight": 1})
    agent_shadow_set(agent=agent, actor="t", via="tests", version=v1, rate=0.5)
    settings.PLATFORM_FLOW_GRAPHS = [OTHER]  # v1 can no longer run

    agent_arm_update(arm=arm, actor="t", via="tests", data={"weight": 0})  # taking it off live traffic
    agent_update(agent=agent, actor="t", via="tests", data={"shadow_sample_rate": 0.0, "name": "고칠 에이전트"})
    arm.refresh_from_db()
    agent.refresh_from_db()
    assert (arm.version, arm.weight) == (v1, 0)
    assert (agent.live_version, agent.shadow_version, agent.name) == (v1, v1, "고칠 에이전트")


# --- the A/B results page -------------------------------------------------------------------------------------


def test_the_ab_results_page_offers_an_agent_whose_arms_were_deleted(
    admin_client: Client, demo_agent: Agent, demo_server: McpServer
) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    arm = agent_arm_create(actor="t", via="tests", data={"agent": demo_agent, "name": "a", "version": v1, "weight": 1})
    key, _ = api_key_create(actor="t", via="tests", name="caller")
    ran = run_create(agent_slug=demo_agent.slug, query="A-1001 자산의 현재 상태를 알려주세요.", api_key=key)
    assert ran.arm == "a"
    agent_arm_delete(arm=arm, actor="t", via="tests")  # the experiment stopped
    unarmed = make_agent(slug="no-arms", servers=[demo_server])
    run_create(agent_slug=unarmed.slug, query="안녕하세요", api_key=None)  # a run under no arm

    response = admin_client.get("/admin/agents/agentarm/metrics/")
    assert [agent.slug for agent in response.context["agents"]] == [demo_agent.slug]
    assert response.context["agent"] == demo_agent
    # And the arms list leads there, with no arm left to link from its rows.
    listing = admin_client.get("/admin/agents/agentarm/").content.decode()
    assert 'id="compare-the-arms"' in listing and "/admin/agents/agentarm/metrics/" in listing
