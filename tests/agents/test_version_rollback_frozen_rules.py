"""A version this installation froze itself, rolled back to or re-imported, is not refused by the frozen-rule
checks that came after it (a secret in params, an empty keyword, no server or tool): they judge what an import
brings in from another installation, as a stored rule's are judged where its value changes.

A rule stored before the empty-keyword check still saves as it is and is frozen so by a publish; rolling back to
that version was refused ("an empty keyword matches every query"), though its runs had run it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import agent_update, agent_version_publish, agent_version_rollback, deterministic_rule_update
from audit.change_guard import change_scope

pytestmark = pytest.mark.django_db

SECRET = "sk-live-abcdefghijklmnopqrstu"
EMPTY_KEYWORD = "any_keywords: an empty keyword matches every query"


def published_with_a_legacy_rule(agent: Agent) -> AgentVersion:
    """v1 of ``agent``, frozen from a rule stored before the empty-keyword check (written straight to its row, as
    it was then), then v2 with another prompt."""
    rule = DeterministicRule.objects.filter(agent=agent).order_by("order").first()
    assert rule is not None
    when = {**rule.when, "any_keywords": [*(rule.when.get("any_keywords") or []), ""]}
    with change_scope(actor="t", via="tests"):
        DeterministicRule.objects.filter(pk=rule.pk).update(when=when)
    rule.refresh_from_db()
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"name": rule.name + " (renamed)"})
    v1 = agent_version_publish(agent=agent, actor="t", via="tests", note="v1")
    assert "" in v1.content["rules"][0]["when"]["any_keywords"]
    agent_update(agent=agent, actor="t", via="tests", data={"system_prompt": "changed"})
    agent_version_publish(agent=agent, actor="t", via="tests", note="v2")
    return v1


def test_a_rollback_to_a_version_frozen_with_a_stored_legacy_rule_is_published(demo_agent: Agent) -> None:
    v1 = published_with_a_legacy_rule(demo_agent)
    v3 = agent_version_rollback(version=v1, actor="t", via="tests")
    assert v3.number == 3
    assert v3.content["rules"] == v1.content["rules"]
    assert Agent.objects.get(pk=demo_agent.pk).live_version_id == v3.pk


def test_a_rollback_still_refuses_what_its_runs_could_not_use(demo_agent: Agent) -> None:
    """The checks a rollback made before keep refusing: a rule whose conditions do not load."""
    v1 = published_with_a_legacy_rule(demo_agent)
    content = copy.deepcopy(v1.content)
    content["rules"][0]["when"]["no_such_condition"] = True
    AgentVersion.objects.filter(pk=v1.pk).update(content=content)
    v1.refresh_from_db()
    with pytest.raises(ValidationError) as refused:
        agent_version_rollback(version=v1, actor="t", via="tests")
    assert any(m.startswith("rules[0] (") and ".when:" in m for m in refused.value.messages), refused.value.messages


def test_an_installation_re_importing_its_own_export_with_such_a_version_is_unchanged(demo_agent: Agent) -> None:
    """The export names the live version (v3, rolled back to v1) and carries its content."""
    agent_version_rollback(version=published_with_a_legacy_rule(demo_agent), actor="t", via="tests")
    document = config_export()
    report = config_import(actor="t", document=document)
    assert "version company-assistant v3" in report.unchanged
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 3


def test_a_new_version_with_such_a_rule_is_still_refused_on_import(demo_agent: Agent) -> None:
    """The same content under a number this installation does not have is brought in: it is checked."""
    agent_version_rollback(version=published_with_a_legacy_rule(demo_agent), actor="t", via="tests")
    document = config_export()
    entry = next(a for a in document["agents"] if a["slug"] == demo_agent.slug)
    copied: dict[str, Any] = copy.deepcopy(next(v for v in entry["versions"] if v["number"] == 3))
    copied["number"] = 9
    entry["versions"].append(copied)
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)
    assert "versions: v9: rules[0] (" in refused.value.message and EMPTY_KEYWORD in refused.value.message
    assert not AgentVersion.objects.filter(agent=demo_agent, number=9).exists()


def test_an_imported_version_whose_rule_params_hold_a_secret_is_still_refused(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    document = config_export()
    entry = next(a for a in document["agents"] if a["slug"] == demo_agent.slug)
    copied: dict[str, Any] = copy.deepcopy(entry["versions"][0])
    copied["number"] = 9
    copied["content"]["rules"][0]["params"]["api_key"] = SECRET
    entry["versions"].append(copied)
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)
    assert (
        "versions: v9: rules[0] (" in refused.value.message and ".params: This holds a secret" in refused.value.message
    )
    assert SECRET not in refused.value.message
    assert not AgentVersion.objects.filter(agent=demo_agent, number=9).exists()
