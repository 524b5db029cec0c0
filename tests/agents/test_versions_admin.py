"""The admin's version pages: the list, a diff between two versions, roll back (through the services, audited);
the A/B arms' metrics page with its charts and significance statement; shadow comparisons, disagreements first."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.execution import run_execute
from agents.models import Agent, AgentArm, AgentVersion, DeterministicRule, Run
from agents.services import (
    agent_arm_create,
    agent_version_publish,
    deterministic_rule_update,
    run_create,
    run_feedback_record,
)
from audit.models import AuditEvent
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def two_versions(agent: Agent) -> tuple[AgentVersion, AgentVersion]:
    v1 = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(
        rule=rule, actor="test-admin", via="tests", data={"answer_template": "새 {result.asset_id}"}
    )
    return v1, agent_version_publish(agent=agent, actor="test-admin", via="tests")


def test_the_diff_page_shows_what_changed_and_roll_back_publishes_the_old_version(
    admin_client: Client, demo_agent: Agent
) -> None:
    v1, v2 = two_versions(demo_agent)
    listing = admin_client.get("/admin/agents/agentversion/")
    assert listing.status_code == 200 and "company-assistant v2" in listing.content.decode()
    page = admin_client.get(f"/admin/agents/agentversion/{v2.pk}/diff/").content.decode()
    assert "rules.자산 상태 조회.answer_template" in page and "새 {result.asset_id}" in page
    assert admin_client.get(f"/admin/agents/agentversion/{v2.pk}/change/").status_code == 200

    response = admin_client.post(
        "/admin/agents/agentversion/", {"action": "rollback", "_selected_action": [v1.pk]}, follow=True
    )
    assert response.status_code == 200
    demo_agent.refresh_from_db()
    assert (demo_agent.live_version.number, demo_agent.live_version.digest) == (3, v1.digest)
    assert AuditEvent.objects.filter(action="config.agent_version.publish", actor="admin").count() == 1


def test_a_version_cannot_be_edited_or_deleted_in_the_admin(admin_client: Client, demo_agent: Agent) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    admin_client.post(f"/admin/agents/agentversion/{v1.pk}/change/", {"note": "고침"})
    admin_client.post(f"/admin/agents/agentversion/{v1.pk}/delete/", {"post": "yes"})
    v1.refresh_from_db()
    assert v1.note == ""


def test_the_publish_action_makes_the_draft_live(admin_client: Client, demo_agent: Agent) -> None:
    admin_client.post("/admin/agents/agent/", {"action": "publish", "_selected_action": [demo_agent.pk]})
    demo_agent.refresh_from_db()
    assert demo_agent.live_version is not None and demo_agent.live_version.published_by == "admin"


def test_the_arms_metrics_page_compares_the_arms_with_a_z_test(
    admin_client: Client, demo_agent: Agent, api_caller: ApiCaller
) -> None:
    v1, v2 = two_versions(demo_agent)
    agent_arm_create(
        actor="test-admin", via="tests", data={"agent": demo_agent, "name": "a", "version": v1, "weight": 1}
    )
    agent_arm_create(
        actor="test-admin", via="tests", data={"agent": demo_agent, "name": "b", "version": v2, "weight": 1}
    )
    for i in range(6):
        run = run_create(
            agent_slug=demo_agent.slug,
            query="A-1001 자산의 현재 상태를 알려주세요.",
            api_key=api_caller.key,
            context={"userId": f"E-{i}"},
        )
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        run_feedback_record(run=run, score=5, scale=None, comment="", actor="test")
    arms = set(Run.objects.values_list("arm", flat=True))
    assert arms <= {"a", "b"}
    page = admin_client.get(f"/admin/agents/agentarm/metrics/?agent={demo_agent.slug}").content.decode()
    assert "<svg" in page
    assert "two-proportion z-test" in page
    for arm in arms:
        assert f"<td>{arm}</td>" in page


def test_the_arms_page_without_arms_says_how_to_get_some(admin_client: Client) -> None:
    page = admin_client.get("/admin/agents/agentarm/metrics/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert 'id="no-arms"' in page and 'href="/admin/agents/agentarm/add/"' in page
    assert (
        '<select name="agent">' not in page and "끝난 라이브 실행이 아직 없습니다" not in page
    )  # no empty menu or table
    assert "<title>A/B 실험군 |" in page


def test_an_arm_is_added_in_the_admin_through_the_service(admin_client: Client, demo_agent: Agent) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    response = admin_client.post(
        "/admin/agents/agentarm/add/", {"agent": demo_agent.pk, "name": "a", "version": v1.pk, "weight": 3}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert AgentArm.objects.get(agent=demo_agent).weight == 3
    assert AuditEvent.objects.filter(action="config.agent_arm.create", actor="admin").exists()


def test_shadow_comparisons_list_loads(admin_client: Client) -> None:
    assert admin_client.get("/admin/agents/shadowcomparison/").status_code == 200
