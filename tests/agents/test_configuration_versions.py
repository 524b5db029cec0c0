"""Versions, shadow and A/B arms in ``export_config`` / ``import_config``: an agent's publish-on-save flag, live
version, shadow candidate and rate and its arms travel with the versions they name (their frozen content, made
portable); import applies them through the services (one audit event per change; a dry run writes none) and the
document round-trips through an empty installation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent, AgentArm, AgentVersion, DeterministicRule, Run
from agents.services import (
    agent_arm_create,
    agent_delete,
    agent_shadow_set,
    agent_update,
    agent_version_publish,
    deterministic_rule_update,
    run_create,
)
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_delete
from tests.conftest import DEMO_SECRET

pytestmark = pytest.mark.django_db


def versioned(agent: Agent) -> None:
    """v1 (arm ``a``), v2 (a changed answer template, not live: the shadow candidate at 25 % and arm ``b``), then
    publish on save turned on, which publishes the draft as v3, live."""
    v1 = agent_version_publish(agent=agent, actor="t", via="tests", note="첫 버전")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"answer_template": "후보 {result.asset_id}"})
    v2 = agent_version_publish(agent=agent, actor="t", via="tests", note="후보", make_live=False)
    agent_shadow_set(agent=agent, actor="t", via="tests", version=v2, rate=0.25)
    agent_arm_create(actor="t", via="tests", data={"agent": agent, "name": "a", "version": v1, "weight": 3})
    agent_arm_create(actor="t", via="tests", data={"agent": agent, "name": "b", "version": v2, "weight": 1})
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": True})


def agent_entry(document: dict[str, Any], slug: str = "company-assistant") -> dict[str, Any]:
    return next(a for a in document["agents"] if a["slug"] == slug)


def with_secrets(document: dict[str, Any]) -> dict[str, Any]:
    """The export with the demo server's secret given, as an operator importing it elsewhere would."""
    document = copy.deepcopy(document)
    for server in document["servers"]:
        for name, value in server["env"].items():
            if value == {"set": True}:
                server["env"][name] = {"value": DEMO_SECRET}
    return document


def emptied() -> None:
    for agent in Agent.objects.all():
        agent_delete(agent=agent, actor="t", via="tests")
    for server in McpServer.objects.all():
        mcp_server_delete(server=server, actor="t", via="tests")
    assert not AgentVersion.objects.exists() and not DeterministicRule.objects.exists()


def test_the_export_carries_the_version_settings_and_the_versions_they_name(demo_agent: Agent) -> None:
    versioned(demo_agent)
    entry = agent_entry(config_export())
    assert entry["publish_on_save"] is True
    # Its live version is its draft published on save: not named, nor exported (named, a re-import of an edited
    # export took it for a choice and put it back live over the edit's version).
    assert entry["live_version"] is None
    assert entry["shadow"] == {"version": 2, "sample_rate": 0.25}
    assert entry["arms"] == [{"name": "a", "version": 1, "weight": 3}, {"name": "b", "version": 2, "weight": 1}]
    assert [(v["number"], v["note"]) for v in entry["versions"]] == [
        (1, "첫 버전"),
        (2, "후보"),
    ]
    v2 = entry["versions"][1]["content"]
    assert "후보 {result.asset_id}" in [r["answer_template"] for r in v2["rules"]]
    # A rule's row id is the installation's own: left out, resolved by name on import.
    assert all("rule_id" not in r for v in entry["versions"] for r in v["content"]["rules"])


def test_only_the_named_versions_are_exported(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    agent_update(agent=demo_agent, actor="t", via="tests", data={"system_prompt": "두 번째"})
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    entry = agent_entry(config_export())
    assert (entry["live_version"], [v["number"] for v in entry["versions"]]) == (2, [2])
    assert (entry["shadow"], entry["arms"]) == (None, [])


def test_the_document_round_trips_through_an_empty_installation_and_the_versions_run(demo_agent: Agent) -> None:
    versioned(demo_agent)
    exported = config_export()
    emptied()

    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    report = config_import(actor="system:import_config", document=with_secrets(exported))
    assert {"version company-assistant v1", "version company-assistant v2", "arm company-assistant.a"} <= set(
        report.created
    )
    assert config_export() == exported

    # One audit event per change, by the importer.
    events = AuditEvent.objects.filter(id__gt=last)
    actions = [e.action for e in events.filter(action__startswith="config.agent")]
    assert actions.count("config.agent_version.import") == 2
    assert actions.count("config.agent_arm.create") == 2
    assert actions.count("config.agent_version.publish") == 1  # the draft, published on save at the import's end
    assert {e.actor for e in events} == {"system:import_config"}

    agent = Agent.objects.get(slug="company-assistant")
    assert (agent.live_version.number, agent.shadow_version.number) == (3, 2)  # type: ignore[union-attr]
    # The imported versions' rules point at this installation's rules.
    local_ids = set(DeterministicRule.objects.filter(agent=agent).values_list("pk", flat=True))
    assert {r["rule_id"] for r in agent.live_version.content["rules"]} <= local_ids  # type: ignore[union-attr]
    run = run_create(agent_slug=agent.slug, query="A-1001 자산의 현재 상태를 알려주세요.", api_key=None, version=2)
    assert run.version is not None and run.version.number == 2


def test_importing_the_same_document_again_changes_nothing_and_records_nothing(demo_agent: Agent) -> None:
    versioned(demo_agent)
    exported = config_export()
    before = AuditEvent.objects.count()
    report = config_import(actor="t", document=exported)
    assert not report.created and not report.updated and not report.deleted
    assert AuditEvent.objects.count() == before


def test_a_dry_run_applies_nothing_and_writes_no_event(demo_agent: Agent) -> None:
    versioned(demo_agent)
    exported = config_export()
    emptied()
    before = AuditEvent.objects.count()
    report = config_import(actor="t", document=with_secrets(exported), dry_run=True)
    assert "version company-assistant v2" in report.created
    assert AuditEvent.objects.count() == before
    assert not Agent.objects.exists() and not AgentVersion.objects.exists() and not AgentArm.objects.exists()


@pytest.mark.slow
def test_the_document_sets_shadow_and_arms_and_removes_arms_it_does_not_name(demo_agent: Agent) -> None:
    versioned(demo_agent)
    document = config_export()
    entry = agent_entry(document)
    entry["shadow"] = None
    entry["arms"] = [{"name": "a", "version": 2, "weight": 5}]
    entry["live_version"] = 2
    report = config_import(actor="t", document=document)
    assert report.updated == [
        "agent company-assistant (live_version, shadow_sample_rate, shadow_version)",
        "arm company-assistant.a",
    ]
    assert report.deleted == ["arm company-assistant.b"]
    demo_agent.refresh_from_db()
    assert (demo_agent.live_version.number, demo_agent.shadow_version, demo_agent.shadow_sample_rate) == (2, None, 0.0)  # type: ignore[union-attr]
    assert [(a.name, a.version.number, a.weight) for a in AgentArm.objects.filter(agent=demo_agent)] == [("a", 2, 5)]
    assert AuditEvent.objects.filter(action="config.agent_arm.delete").count() == 1


def test_a_version_whose_content_differs_from_the_stored_one_is_refused_and_nothing_changes(
    demo_agent: Agent,
) -> None:
    versioned(demo_agent)
    document = config_export()
    entry = agent_entry(document)
    entry["versions"][0]["content"]["agent"]["system_prompt"] = "바뀐 프롬프트"
    entry["arms"] = []
    before = AuditEvent.objects.count()
    with pytest.raises(ApplicationError) as failure:
        config_import(actor="t", document=document)
    assert "agents[0] (company-assistant): versions: v1 is not the content" in failure.value.message
    assert AuditEvent.objects.count() == before and AgentArm.objects.filter(agent=demo_agent).count() == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"live_version": 7}, "live_version: no version 7"),
        ({"arms": [{"name": "c", "version": 9}]}, "arms.c: no version 9"),
        ({"shadow": {"version": 8, "sample_rate": 0.5}}, "shadow: no version 8"),
        ({"shadow": {"version": 1, "sample_rate": 1.5}}, "shadow.sample_rate"),
        ({"arms": [{"name": "a", "version": 1}, {"name": "a", "version": 1}]}, "arms: a name is given twice"),
    ],
)
def test_a_setting_naming_a_missing_version_or_a_bad_value_is_named(
    demo_agent: Agent, change: dict[str, Any], message: str
) -> None:
    versioned(demo_agent)
    document = config_export()
    agent_entry(document).update(change)
    with pytest.raises(ApplicationError) as failure:
        config_import(actor="t", document=document)
    assert message in failure.value.message


def test_a_version_without_the_frozen_agent_fields_is_refused(demo_agent: Agent) -> None:
    versioned(demo_agent)
    document = config_export()
    del agent_entry(document)["versions"][0]["content"]["agent"]["mode"]
    with pytest.raises(ApplicationError) as failure:
        config_import(actor="t", document=document)
    assert "missing mode" in failure.value.message


def test_an_agent_that_publishes_on_save_publishes_once_for_an_import_that_changes_it(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    first = AgentVersion.objects.filter(agent=demo_agent).count()
    document = config_export()
    for key in ("live_version", "shadow", "arms", "versions"):  # a document that leaves versions to the agent
        del agent_entry(document)[key]
    agent_entry(document)["system_prompt"] = "새 프롬프트"
    for rule in document["rules"]:
        rule["answer_template"] = rule["answer_template"] + " (가져옴)"
    document["contracts"][0]["timeout_s"] = 11
    report = config_import(actor="t", document=document)
    demo_agent.refresh_from_db()
    assert AgentVersion.objects.filter(agent=demo_agent).count() == first + 1
    assert demo_agent.live_version.content["agent"]["system_prompt"] == "새 프롬프트"  # type: ignore[union-attr]
    assert f"version company-assistant v{first + 1}" in report.created
    assert Run.objects.count() == 0


def test_the_commands_carry_versions_and_the_import_says_what_it_would_create_and_delete(
    demo_agent: Agent, tmp_path: Any
) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    versioned(demo_agent)
    path = tmp_path / "config.json"
    call_command("export_config", "-o", str(path))
    document = json.loads(path.read_text(encoding="utf-8"))
    assert agent_entry(document)["shadow"] == {"version": 2, "sample_rate": 0.25}
    agent_entry(document)["arms"] = [{"name": "a", "version": 1, "weight": 3}]
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    out = StringIO()
    call_command("import_config", str(path), "--dry-run", stdout=out)
    assert "would be deleted: arm company-assistant.b" in out.getvalue()
    assert "unchanged: version company-assistant v2" in out.getvalue()
    assert AgentArm.objects.filter(agent=demo_agent).count() == 2  # a dry run


def test_a_versions_note_over_the_models_bound_is_refused_by_name_not_cut(demo_agent: Agent) -> None:
    """The import cut a note to 500 characters without a word (``agent_version publish`` refuses it); a note
    written decomposed is counted composed, as it is stored."""
    import unicodedata

    versioned(demo_agent)
    document = config_export()
    entry = agent_entry(document)
    entry["versions"][0]["note"] = "가" * 501
    with pytest.raises(ApplicationError) as failure:
        config_import(actor="t", document=document)
    assert "note" in failure.value.message and "500" in failure.value.message
    assert AgentVersion.objects.get(agent=demo_agent, number=1).note == "첫 버전"

    fresh = config_export()
    written = unicodedata.normalize("NFD", "한" * 400)  # 1,200 code points decomposed, 400 composed
    new = copy.deepcopy(agent_entry(fresh)["versions"][-1])
    new.update(number=9, note=written)
    agent_entry(fresh)["versions"].append(new)
    config_import(actor="t", document=with_secrets(fresh))
    assert AgentVersion.objects.get(agent=demo_agent, number=9).note == "한" * 400
