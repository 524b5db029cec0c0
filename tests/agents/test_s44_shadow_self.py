"""A live run that already ran the shadow candidate (under an A/B arm on it, or with the candidate made live) is not
shadowed on that same version: the pair would always agree and inflate the candidate's agreement, and spend a
second run of tool calls and budget. A live run on another version is still shadowed."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run, ShadowComparison
from agents.services import (
    agent_arm_create,
    agent_shadow_set,
    agent_update,
    agent_version_publish,
    deterministic_rule_update,
    run_create,
)

pytestmark = pytest.mark.django_db

ASSET_QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def live_run(agent: Agent) -> Run:
    run = run_create(agent_slug=agent.slug, query=ASSET_QUESTION, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def with_candidate(agent: Agent) -> None:
    """v1 live; a candidate v2 that answers otherwise; every live run shadowed on v2."""
    agent_version_publish(agent=agent, actor="test-admin", via="tests")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(
        rule=rule, actor="test-admin", via="tests", data={"answer_template": "후보 {result.asset_id}"}
    )
    candidate = agent_version_publish(agent=agent, actor="test-admin", via="tests", make_live=False)
    agent.refresh_from_db()
    agent_shadow_set(agent=agent, actor="test-admin", via="tests", version=candidate, rate=1.0)
    agent.refresh_from_db()


def test_a_live_run_under_an_arm_on_the_candidate_is_not_shadowed_on_it(demo_agent: Agent) -> None:
    with_candidate(demo_agent)
    # The control: a run on the live version v1 is shadowed on v2.
    on_live = live_run(demo_agent)
    shadow = Run.objects.get(shadow_of=on_live)
    assert on_live.version is not None and shadow.version is not None
    assert (on_live.version.number, shadow.version.number) == (1, 2)

    agent_arm_create(
        actor="test-admin",
        via="tests",
        data={"agent": demo_agent, "name": "candidate", "version": demo_agent.shadow_version, "weight": 100},
    )
    on_candidate = live_run(demo_agent)
    assert on_candidate.version is not None
    assert (on_candidate.status, on_candidate.version.number) == (Run.Status.SUCCEEDED, 2)
    assert on_candidate.answer == "후보 A-1001"
    assert not Run.objects.filter(shadow_of=on_candidate).exists()
    assert not ShadowComparison.objects.filter(live_run=on_candidate).exists()


def test_a_live_run_of_the_candidate_made_live_is_not_shadowed_on_it(demo_agent: Agent) -> None:
    with_candidate(demo_agent)
    candidate = demo_agent.shadow_version
    assert candidate is not None
    agent_update(agent=demo_agent, actor="test-admin", via="tests", data={"live_version": candidate})
    demo_agent.refresh_from_db()
    assert (demo_agent.live_version_id, demo_agent.shadow_version_id) == (candidate.pk, candidate.pk)
    run = live_run(demo_agent)
    assert (run.status, run.version_id) == (Run.Status.SUCCEEDED, candidate.pk)
    assert not Run.objects.filter(purpose=Run.Purpose.SHADOW).exists()
