"""Publish on save publishes what an agent edit changed in a version, never over an admin's choice of live version.

Defect held here: on an agent that publishes on save, every agent edit published the draft, whatever it changed.
After a roll back the draft differs from the live version, so an edit of a setting no version freezes (the shadow
sample rate, the time limit) published the draft and undid the roll back; choosing an older live version
(``agent_update(data={"live_version": v1})``, or the admin form) was overridden in the same transaction by a new
"published on save" version."""

from __future__ import annotations

import pytest

from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import agent_update, agent_version_rollback, deterministic_rule_update
from mcpregistry.models import McpServer
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def asset_rule(agent: Agent) -> DeterministicRule:
    return DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")


def rolled_back(agent: Agent) -> tuple[AgentVersion, AgentVersion]:
    """The agent publishing on save, its rule edited (v2 live), then rolled back to v1 (v3 live). Returns (v1, v3)."""
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": True})
    agent.refresh_from_db()
    v1 = agent.live_version
    assert v1 is not None
    deterministic_rule_update(
        rule=asset_rule(agent), actor="t", via="tests", data={"answer_template": "새 {result.asset_id}"}
    )
    v3 = agent_version_rollback(version=v1, actor="t", via="tests")
    agent.refresh_from_db()
    assert (agent.live_version, v3.number, v3.digest) == (v3, 3, v1.digest)
    return v1, v3


def versions(agent: Agent) -> int:
    return AgentVersion.objects.filter(agent=agent).count()


@pytest.mark.parametrize("setting", [{"shadow_sample_rate": 0.5}, {"time_limit_s": 77}, {"name": "자산 도우미"}])
def test_an_edit_of_a_setting_no_version_freezes_keeps_a_roll_back_live(
    demo_agent: Agent, setting: dict[str, object]
) -> None:
    _, v3 = rolled_back(demo_agent)
    agent_update(agent=demo_agent, actor="t", via="tests", data=setting)
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v3
    assert versions(demo_agent) == 3


def test_choosing_an_older_live_version_is_not_overridden_by_publish_on_save(demo_agent: Agent) -> None:
    v1, _ = rolled_back(demo_agent)
    deterministic_rule_update(
        rule=asset_rule(demo_agent), actor="t", via="tests", data={"answer_template": "넷 {result.asset_id}"}
    )
    demo_agent.refresh_from_db()
    assert demo_agent.live_version.number == 4  # type: ignore[union-attr]
    agent_update(agent=demo_agent, actor="t", via="tests", data={"live_version": v1})
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1
    assert versions(demo_agent) == 4


def test_the_admin_form_choosing_a_live_version_and_editing_the_prompt_keeps_the_choice(demo_agent: Agent) -> None:
    # As ``AgentAdmin.service_save`` does: the form's instance carries the changes, ``servers`` the bound servers.
    v1, _ = rolled_back(demo_agent)
    form_instance = Agent.objects.get(pk=demo_agent.pk)
    form_instance.live_version = v1
    form_instance.system_prompt = "바뀐 프롬프트"
    agent_update(agent=form_instance, actor="t", via="admin", servers=list(demo_agent.servers.all()))
    demo_agent.refresh_from_db()
    assert (demo_agent.live_version, demo_agent.system_prompt) == (v1, "바뀐 프롬프트")
    assert versions(demo_agent) == 3


def test_an_admin_form_edit_of_a_setting_no_version_freezes_publishes_nothing(demo_agent: Agent) -> None:
    _, v3 = rolled_back(demo_agent)
    form_instance = Agent.objects.get(pk=demo_agent.pk)
    form_instance.shadow_sample_rate = 0.25
    agent_update(agent=form_instance, actor="t", via="admin", servers=list(demo_agent.servers.all()))
    demo_agent.refresh_from_db()
    assert (demo_agent.live_version, demo_agent.shadow_sample_rate) == (v3, 0.25)


def test_an_edit_of_a_frozen_setting_still_publishes_the_draft(demo_agent: Agent) -> None:
    _, v3 = rolled_back(demo_agent)
    form_instance = Agent.objects.get(pk=demo_agent.pk)
    form_instance.system_prompt = "새 프롬프트"
    agent_update(agent=form_instance, actor="t", via="admin", servers=list(demo_agent.servers.all()))
    demo_agent.refresh_from_db()
    live = demo_agent.live_version
    assert live is not None and live.number == v3.number + 1 and live.note == "published on save"
    assert live.content["agent"]["system_prompt"] == "새 프롬프트"


def test_binding_another_server_publishes_the_draft(demo_agent: Agent, demo_server: McpServer) -> None:
    _, v3 = rolled_back(demo_agent)
    other = McpServer.objects.create(
        mcp_id="other-server", name="다른 서버", transport=McpServer.Transport.STDIO, command="true"
    )
    agent_update(agent=demo_agent, actor="t", via="tests", servers=[demo_server, other])
    demo_agent.refresh_from_db()
    assert demo_agent.live_version.number == v3.number + 1  # type: ignore[union-attr]
    assert "other-server" in demo_agent.live_version.content["servers"]  # type: ignore[union-attr]


def test_turning_publish_on_save_on_publishes_the_draft_only_where_it_differs_from_the_live_version(
    demo_server: McpServer,
) -> None:
    agent = make_agent(slug="switching", servers=[demo_server])
    _, v3 = rolled_back(agent)
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": False})
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": True})
    agent.refresh_from_db()
    live = agent.live_version
    assert live is not None and live.number == v3.number + 1  # the draft (the edited rule) asked for
    assert [r["answer_template"] for r in live.content["rules"] if r["tool_name"] == "get_asset_status"] == [
        "새 {result.asset_id}"
    ]
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": False})
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": True})
    agent.refresh_from_db()
    assert agent.live_version == live  # the draft is live already: nothing new
