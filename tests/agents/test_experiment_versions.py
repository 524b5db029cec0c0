"""Comparing versions: an A/B arm moved to another version has a row per version (never one pooling both), and
a version diff tells rules of one name (or none) apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import translation

from agents.execution import run_execute
from agents.experiments import arm_comparisons, arm_metrics
from agents.models import Agent, AgentArm, DeterministicRule, Run
from agents.services import (
    agent_arm_create,
    agent_arm_update,
    agent_update,
    agent_version_publish,
    deterministic_rule_create,
    deterministic_rule_update,
    run_create,
)
from agents.versions import version_diff

pytestmark = pytest.mark.django_db

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


@pytest.fixture(autouse=True)
def _english() -> Iterator[None]:
    with translation.override("en"):
        yield


def runs(agent: Agent, count: int) -> None:
    for _ in range(count):
        run = run_create(agent_slug=agent.slug, query=QUESTION, api_key=None)
        run_execute(run_id=str(run.id))


def test_an_arm_moved_to_another_version_has_a_row_per_version(demo_agent: Agent, admin_client) -> None:  # type: ignore[no-untyped-def]
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    agent_update(agent=demo_agent, actor="test-admin", via="tests", data={"system_prompt": "v2"})
    v2 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", make_live=False)
    agent_update(agent=demo_agent, actor="test-admin", via="tests", data={"system_prompt": "v3"})
    v3 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", make_live=False)
    assert (v1.number, v2.number, v3.number) == (1, 2, 3)
    arm = agent_arm_create(
        actor="test-admin", via="tests", data={"agent": demo_agent, "name": "b", "version": v3, "weight": 1}
    )
    runs(demo_agent, 3)
    agent_arm_update(arm=AgentArm.objects.get(pk=arm.pk), actor="test-admin", via="tests", data={"version": v2})
    runs(demo_agent, 2)
    assert sorted(Run.objects.filter(arm="b").values_list("version__number", flat=True)) == [2, 2, 3, 3, 3]

    metrics = arm_metrics(agent=demo_agent)
    # One row per version of the arm, oldest version first, each with its own runs only.
    assert [(m.arm, m.version, m.runs) for m in metrics] == [("b", 2, 2), ("b", 3, 3)]
    assert [m.label for m in metrics] == ["b (v2)", "b (v3)"]
    statement = next(c.statement for c in arm_comparisons(metrics) if c.metric == "success_rate")
    assert "of arm b (v3) 100.0% vs arm b (v2) 100.0%" in statement

    page = admin_client.get(f"/admin/agents/agentarm/metrics/?agent={demo_agent.slug}").content.decode()
    assert "<td>b</td><td>v2</td><td>2</td>" in page and "<td>b</td><td>v3</td><td>3</td>" in page
    assert "An arm moved to another version has a row for each version" in page


def test_a_changed_rule_shows_in_the_diff_when_another_rule_has_its_name(demo_agent: Agent) -> None:
    first = DeterministicRule.objects.get(agent=demo_agent, tool_name="get_asset_status")
    copy = deterministic_rule_create(
        actor="test-admin",
        via="tests",
        data={
            "agent": demo_agent,
            "name": first.name,  # a copy of the rule, under the same name
            "order": first.order + 10,
            "server": first.server,
            "tool_name": first.tool_name,
            "when": {**first.when, "any_keywords": ["zzz"]},
            "params": first.params,
        },
    )
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    deterministic_rule_update(
        rule=first, actor="test-admin", via="tests", data={"answer_template": "바뀐 {result.asset_id}"}
    )
    v2 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    # Named by the rule's name and its id (the name alone would not say which), the other rule unchanged.
    assert [(row["path"], row["new"]) for row in version_diff(v1.content, v2.content)] == [
        (f"rules.{first.name} #{first.pk}.answer_template", "바뀐 {result.asset_id}")
    ]
    assert copy.pk != first.pk


def rule(name: str, template: str, rule_id: int | None = None) -> dict[str, Any]:
    return {"rule_id": rule_id, "name": name, "answer_template": template}


def test_a_rule_without_a_name_never_takes_the_place_of_a_rule_named_like_its_number() -> None:
    # Imported rules (no row id): one named "1" and one without a name, second.
    old = {"rules": [rule("1", "named before"), rule("", "unnamed")]}
    new = {"rules": [rule("1", "named after"), rule("", "unnamed")]}
    assert version_diff(old, new) == [{"path": "rules.1.answer_template", "old": "named before", "new": "named after"}]
    # Two rules without a name, and one whose name is what the second one's label would be.
    old = {"rules": [rule("", "a", 7), rule("", "b", 8), rule("#8", "c", 9)]}
    new = {"rules": [rule("", "a", 7), rule("", "b2", 8), rule("#8", "c2", 9)]}
    assert [(row["path"], row["new"]) for row in version_diff(old, new)] == [
        ("rules.#8'.answer_template", "b2"),
        ("rules.#8.answer_template", "c2"),
    ]


def test_a_renamed_rule_is_one_rule_whose_name_changed() -> None:
    old = {"rules": [rule("old name", "same", 5)]}
    new = {"rules": [rule("new name", "same", 5)]}
    assert version_diff(old, new) == [{"path": "rules.new name.name", "old": "old name", "new": "new name"}]
