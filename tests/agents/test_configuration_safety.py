"""Configuration as code refuses what it cannot store or must not: a secret made a setting, a version that could
not run, a value no JSON column holds, a key given twice. Each refusal names the entry and the field and changes
nothing; an export re-imports with no event, whatever the installation's settings."""

from __future__ import annotations

import copy
import json
import unicodedata
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agent_platform.errors import ApplicationError
from agents import configuration
from agents.configuration import config_export, config_import
from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import agent_update, agent_version_publish
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_update, mcp_tool_update
from tests.agents.test_configuration import SECRET, document
from tests.agents.test_configuration_versions import agent_entry, emptied, with_secrets

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _docs_token_may_be_passed_through(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["DOCS_TOKEN"]


def refused(doc: dict[str, Any]) -> str:
    """The import's message for ``doc``; it must have changed nothing."""
    before = AuditEvent.objects.count()
    with pytest.raises(ApplicationError) as failure:
        config_import(actor="t", document=doc)
    assert AuditEvent.objects.count() == before
    return failure.value.message


# --- 1. a secret never becomes a setting ------------------------------------------------------------------


def test_public_env_cannot_turn_a_stored_secret_into_a_setting() -> None:
    config_import(actor="t", document=document())
    doc = document()
    doc["servers"][0]["env"]["INTERNAL_API_KEY"] = {"set": True}  # keep the stored value... and show it
    doc["servers"][0]["public_env"] = ["FAILURE_MODE", "INTERNAL_API_KEY"]
    message = refused(doc)
    assert "servers[0] (company): public_env: 'INTERNAL_API_KEY'" in message
    server = McpServer.objects.get(mcp_id="company")
    assert server.public_env == [] and server.env["INTERNAL_API_KEY"] == SECRET
    assert SECRET not in json.dumps(config_export(), ensure_ascii=False)


@pytest.mark.parametrize(
    "given", [{"from_env": "DOCS_TOKEN"}, {"value": "now-a-setting"}], ids=["from_env", "new_value"]
)
def test_a_stored_secret_may_become_a_setting_given_anew(given: dict[str, Any]) -> None:
    # A reference to the environment, or a new value: the stored secret is replaced, never shown. (A name that
    # says it is a secret, INTERNAL_API_KEY, never becomes a setting: ``McpServer.clean``.)
    doc = document()
    doc["servers"][0]["env"]["TENANT"] = {"value": SECRET + "-tenant"}
    config_import(actor="t", document=doc)
    doc["servers"][0]["env"]["TENANT"] = given
    doc["servers"][0]["public_env"] = ["FAILURE_MODE", "TENANT"]
    config_import(actor="t", document=doc)
    exported = config_export()
    assert SECRET not in json.dumps(exported, ensure_ascii=False)
    assert exported["servers"][0]["env"]["TENANT"] == given
    assert not config_import(actor="t", document=exported).updated  # and it re-imports unchanged


def test_a_setting_of_a_new_server_must_be_given_its_value() -> None:
    doc = document()
    doc["servers"][0]["env"]["TENANT"] = {"set": True}
    doc["servers"][0]["public_env"] = ["TENANT"]
    assert "TENANT" in refused(doc)
    doc["servers"][0]["env"]["TENANT"] = {"value": "shown"}
    config_import(actor="t", document=doc)
    exported = config_export()
    assert exported["servers"][0]["env"]["TENANT"] == {"value": "shown"}
    assert not config_import(actor="t", document=exported).updated


def test_a_name_that_says_it_is_a_secret_never_becomes_a_setting() -> None:
    doc = document()
    doc["servers"][0]["env"]["INTERNAL_API_KEY"] = {"value": "shown"}
    doc["servers"][0]["public_env"] = ["INTERNAL_API_KEY"]
    assert "servers[0] (company): public_env: INTERNAL_API_KEY: its name says it is a secret" in refused(doc)


# --- 2. a version's values have their fields' types -------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_iterations", "5", "agent.max_iterations: Enter a whole number."),
        ("max_iterations", True, "agent.max_iterations: Enter a whole number."),
        ("max_iterations", 1_000_000, "agent.max_iterations: Ensure this value is less than or equal to 100."),
        ("system_prompt", 5, "agent.system_prompt: Enter a text."),
        ("system_prompt", None, "agent.system_prompt: This field cannot be null."),
        ("answer_from_deterministic", "yes", "agent.answer_from_deterministic: Enter true or false."),
    ],
)
def test_a_version_with_a_value_of_the_wrong_type_or_out_of_bounds_is_refused(
    demo_agent: Agent, field: str, value: Any, message: str
) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    entry = agent_entry(doc)
    version = copy.deepcopy(entry["versions"][0])
    version["number"] = 9
    version["content"]["agent"][field] = value
    entry["versions"].append(version)
    assert f"agents[0] (company-assistant): versions: v9: {message}" in refused(doc)
    assert not AgentVersion.objects.filter(number=9).exists()


@pytest.mark.parametrize("when", [[], None])
def test_a_version_whose_rule_conditions_are_not_an_object_is_refused(demo_agent: Agent, when: Any) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    entry = agent_entry(doc)
    version = copy.deepcopy(entry["versions"][0])
    version["number"] = 9
    version["content"]["rules"][0]["when"] = when
    entry["versions"].append(version)
    assert ".when: Enter a JSON object." in refused(doc)


# --- 3. a version calls only its agent's servers ----------------------------------------------------------


def test_a_version_naming_a_server_that_does_not_exist_imports_with_a_warning(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    version = copy.deepcopy(agent_entry(doc)["versions"][0])
    version["content"]["servers"] = ["nowhere"]
    doc["agents"].append({"slug": "ghost", "servers": [], "versions": [version], "live_version": version["number"]})
    report = config_import(actor="t", document=doc)
    assert report.warnings == [
        "version ghost v1 names MCP server 'nowhere' (servers), which does not exist here: imported as published; "
        "its runs leave that server out"
    ]
    assert Agent.objects.get(slug="ghost").live_version.content["servers"] == ["nowhere"]


def test_a_version_naming_a_server_its_agent_no_longer_binds_imports(demo_agent: Agent) -> None:
    # Frozen as published: the agent may have unbound the server since (a rollback re-publishes it so).
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    version = copy.deepcopy(agent_entry(doc)["versions"][0])
    doc["agents"].append({"slug": "unbound", "servers": [], "versions": [version], "live_version": version["number"]})
    config_import(actor="t", document=doc)
    assert Agent.objects.get(slug="unbound").live_version.number == version["number"]


# --- 4. failure is a value ------------------------------------------------------------------------------


def test_an_arm_weight_no_column_holds_is_named(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    agent_entry(doc)["arms"] = [{"name": "a", "version": 1, "weight": 10**20}]
    assert "agents[0] (company-assistant).arms.0.weight" in refused(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("servers: !!set {? a, ? b}\n", "servers: a set is not a JSON value"),
        (
            "agents: [{slug: a, model: {params: {temperature: .nan}}}]\n",
            "agents[0] (a).model.params.temperature: NaN and Infinity are not numbers",
        ),
        ("rules: [{name: r, when: {context: {day: 2024-01-01}}}]\n", "rules[0] (r).when.context.day: a date"),
        ("rules: [{name: r, when: {context: {1: a}}}]\n", "rules[0] (r).when.context: a key that is not a text"),
        ("rules: [{name: r, when: {context: {x: !!binary aGVsbG8=}}}]\n", "rules[0] (r).when.context.x: a bytes"),
    ],
)
def test_a_yaml_value_no_json_column_holds_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CommandError) as failure:
        call_command("import_config", str(path), stdout=StringIO())
    assert message in str(failure.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [("a\ud800b", "agents[0] (assistant).system_prompt: Text may not contain unpaired"), ("a\x00b", "NUL characters")],
)
def test_a_lone_surrogate_or_a_nul_character_is_named(text: str, where: str) -> None:
    doc = document()
    doc["agents"][0]["system_prompt"] = text
    assert where in refused(doc)
    assert not Agent.objects.exists()


@pytest.mark.parametrize("name", ["", "t" * 201])
def test_a_tool_name_that_no_tool_can_have_is_named(name: str) -> None:
    doc = document()
    doc["tools"] = [{"mcp_id": "company", "tool": name, "tags": ["x"]}]
    assert "tools[0] (company." in refused(doc)
    doc = document()
    doc["contracts"][0]["tool"] = name
    assert "contracts[0] (company." in refused(doc) and "tool: a tool's name has 1 to 200 characters" in refused(doc)
    assert not McpTool.objects.exists()


def test_a_document_over_the_size_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(configuration, "MAX_DOCUMENT_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"agents": [{"slug": "a", "system_prompt": "x" * 2000}]}), encoding="utf-8")
    with pytest.raises(CommandError, match="larger than"):
        call_command("import_config", str(path))


def test_yaml_aliases_expanding_past_the_limit_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configuration, "MAX_DOCUMENT_VALUES", 10_000)
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 6)]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CommandError, match="more than 10,000 values"):
        call_command("import_config", str(path))


# --- 5. text is composed ----------------------------------------------------------------------------------


def test_a_rule_named_in_decomposed_korean_is_the_rule_of_that_name() -> None:
    config_import(actor="t", document=document())
    doc = document()
    doc["rules"][0]["name"] = unicodedata.normalize("NFD", doc["rules"][0]["name"])
    doc["rules"][0]["when"]["any_keywords"] = [unicodedata.normalize("NFD", "소속")]
    report = config_import(actor="t", document=doc)
    assert not report.created and not report.updated
    assert list(DeterministicRule.objects.values_list("name", flat=True)) == ["소속 조회"]


def test_a_secret_value_is_kept_as_written_while_the_rest_is_composed() -> None:
    decomposed = unicodedata.normalize("NFD", "비밀값")
    doc = document()
    doc["servers"][0]["env"]["INTERNAL_API_KEY"] = {"value": decomposed}
    doc["agents"][0]["system_prompt"] = unicodedata.normalize("NFD", "회사 정보를 답합니다.")
    config_import(actor="t", document=doc)
    assert McpServer.objects.get(mcp_id="company").env["INTERNAL_API_KEY"] == decomposed
    assert Agent.objects.get().system_prompt == "회사 정보를 답합니다."


# --- 6. a natural key once per section (rules: two of one name are two rules, test_config_roundtrip_defects) ---


@pytest.mark.parametrize(
    ("section", "change", "message"),
    [
        ("servers", {"timeout_s": 11}, "servers[2] (company): named twice (first as servers[0])"),
        ("agents", {"max_iterations": 2}, "agents[1] (assistant): named twice (first as agents[0])"),
        ("contracts", {"timeout_s": 3}, "contracts[1] (company.get_asset_status): named twice"),
    ],
)
def test_an_entry_named_twice_in_a_section_is_refused(section: str, change: dict[str, Any], message: str) -> None:
    doc = document()
    doc[section].append({**copy.deepcopy(doc[section][0]), **change})
    assert message in refused(doc)


def test_a_tool_or_an_eval_set_named_twice_is_refused(demo_agent: Agent) -> None:
    doc = {"tools": [{"mcp_id": "sds-company-data", "tool": "ping", "tags": [t]} for t in ("a", "b")]}
    assert "tools[1] (sds-company-data.ping): named twice" in refused(doc)
    eval_set = {"name": "s", "agent": "company-assistant", "cases": [{"key": "a", "query": "x"}]}
    assert "eval_sets[1] (s): named twice" in refused({"eval_sets": [eval_set, eval_set]})


# --- 7. publish on save with no live version named --------------------------------------------------------


@pytest.mark.slow
def test_publish_on_save_with_a_null_live_version_publishes_once_over_many_imports(demo_agent: Agent) -> None:
    doc = config_export()
    entry = agent_entry(doc)
    entry.update(publish_on_save=True, live_version=None, arms=[], versions=[], shadow=None)
    for _ in range(3):
        config_import(actor="t", document=doc)
    assert list(AgentVersion.objects.values_list("number", flat=True)) == [1]
    exported = config_export()
    assert agent_entry(exported)["live_version"] is None  # its draft published on save: no choice to export
    before = AuditEvent.objects.count()
    config_import(actor="t", document=exported)
    assert AuditEvent.objects.count() == before


# --- 8. the tool switch and the circuit breaker travel ----------------------------------------------------


@pytest.mark.slow
def test_a_disabled_tool_and_the_breaker_settings_round_trip_through_an_empty_installation(
    demo_agent: Agent,
) -> None:
    tool = McpTool.objects.get(server__mcp_id="sds-company-data", name="get_asset_status_backup")
    mcp_tool_update(tool=tool, actor="t", via="tests", data={"enabled": False})
    server = McpServer.objects.get(mcp_id="sds-company-data")
    mcp_server_update(server=server, actor="t", via="tests", data={"breaker_threshold": 2, "breaker_cooldown_s": 600})
    exported = config_export()
    assert {"mcp_id": "sds-company-data", "tool": "get_asset_status_backup", "enabled": False}.items() <= next(
        t for t in exported["tools"] if t["tool"] == "get_asset_status_backup"
    ).items()
    before = AuditEvent.objects.count()
    assert not config_import(actor="t", document=exported).updated
    assert AuditEvent.objects.count() == before

    emptied()
    config_import(actor="t", document=with_secrets(exported))
    tool = McpTool.objects.get(server__mcp_id="sds-company-data", name="get_asset_status_backup")
    server = McpServer.objects.get(mcp_id="sds-company-data")
    assert (tool.enabled, tool.enabled_before_review) == (False, False)  # kept through a review discovery starts
    assert (server.breaker_threshold, server.breaker_cooldown_s) == (2, 600.0)
    assert config_export() == exported


def test_a_tool_entry_without_enabled_leaves_the_switch_alone(demo_agent: Agent) -> None:
    tool = McpTool.objects.get(server__mcp_id="sds-company-data", name="ping")
    mcp_tool_update(tool=tool, actor="t", via="tests", data={"enabled": False})
    config_import(actor="t", document={"tools": [{"mcp_id": "sds-company-data", "tool": "ping", "tags": ["x"]}]})
    assert McpTool.objects.get(pk=tool.pk).enabled is False
    config_import(actor="t", document={"tools": [{"mcp_id": "sds-company-data", "tool": "ping", "enabled": True}]})
    assert McpTool.objects.get(pk=tool.pk).enabled is True


def test_for_a_tool_waiting_for_a_review_enabled_is_what_approving_restores(demo_agent: Agent) -> None:
    from mcpregistry.services import mcp_tool_review_approve

    # As discovery parks a tool the server changed under an admin who had it enabled.
    McpTool.objects.filter(server__mcp_id="sds-company-data", name="ping").update(
        enabled=False, review_required=True, enabled_before_review=True
    )
    exported = config_export()
    [ping] = [t for t in exported["tools"] if t["tool"] == "ping"]
    assert (ping["enabled"], ping["tags"]) == (True, [])  # enabled once approved, no tags
    before = AuditEvent.objects.count()
    config_import(actor="t", document=exported)
    assert AuditEvent.objects.count() == before

    doc = {"tools": [{"mcp_id": "sds-company-data", "tool": "ping", "enabled": False}]}
    config_import(actor="t", document=doc)
    tool = McpTool.objects.get(server__mcp_id="sds-company-data", name="ping")
    assert (tool.enabled, tool.review_required, tool.enabled_before_review) == (False, True, False)
    assert next(t for t in config_export()["tools"] if t["tool"] == "ping")["enabled"] is False
    assert mcp_tool_review_approve(tool=tool, actor="t", via="tests")
    assert McpTool.objects.get(pk=tool.pk).enabled is False  # the document's "off" stays off


# --- 9. the report names only the versions made -----------------------------------------------------------


def test_a_publish_on_save_that_publishes_nothing_is_not_reported_as_a_version(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    doc = config_export()
    for key in ("live_version", "shadow", "arms", "versions"):
        del agent_entry(doc)[key]
    agent_entry(doc)["name"] = "새 이름"  # not frozen in a version
    count = AgentVersion.objects.count()
    report = config_import(actor="t", document=doc)
    assert AgentVersion.objects.count() == count
    assert not [item for item in report.created if item.startswith("version")]


# --- 10. the exported text is stable ----------------------------------------------------------------------


def test_a_contracts_arguments_are_exported_with_their_keys_sorted() -> None:
    doc = document()
    doc["contracts"][0]["args"] = {
        "zone": {"type": "str", "required": False},
        "asset_id": {"type": "str", "pattern": "^A-[0-9]{4}$", "required": True},
    }
    config_import(actor="t", document=doc)
    first = config_export()
    [args] = [c["args"] for c in first["contracts"]]
    assert list(args) == ["asset_id", "zone"]
    assert list(args["asset_id"]) == sorted(args["asset_id"])
    assert ToolContract.objects.get().args["zone"] == {"type": "str", "required": False}
    config_import(actor="t", document=first)
    assert json.dumps(config_export(), ensure_ascii=False) == json.dumps(first, ensure_ascii=False)


def test_a_tool_turned_off_before_its_server_was_discovered_re_imports_unchanged() -> None:
    # A new installation's import names the tool (its server not connected to yet); an admin turns it off.
    doc = document()
    doc["tools"] = [{"mcp_id": "company", "tool": "get_asset", "tags": ["자산"]}]
    config_import(actor="t", document=doc)
    tool = McpTool.objects.get(server__mcp_id="company", name="get_asset")
    assert tool.discovered_at is None
    mcp_tool_update(tool=tool, actor="admin", via="tests", data={"enabled": False})
    exported = config_export()
    before = AuditEvent.objects.count()
    again = config_import(actor="t", document=exported)
    assert not again.updated and AuditEvent.objects.count() == before


def test_text_stored_decomposed_re_imports_as_the_same_rule_and_version(demo_agent: Agent) -> None:
    # The admin keeps text as typed: a rule name pasted decomposed (macOS), then published. Its export, composed
    # on import, is the same rule and the same version, not a second rule or "not this installation's v1".
    import unicodedata

    from agents.models import DeterministicRule
    from agents.services import deterministic_rule_update

    rule = DeterministicRule.objects.filter(agent=demo_agent).first()
    decomposed = unicodedata.normalize("NFD", "직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"name": decomposed})
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    exported = config_export()
    before = AuditEvent.objects.count()
    again = config_import(actor="t", document=exported)
    assert not again.created and not again.updated, (again.created, again.updated)
    assert AuditEvent.objects.count() == before
    assert DeterministicRule.objects.filter(agent=demo_agent, name__in=[decomposed, "직원 소속 조회"]).count() == 1


def test_a_tool_set_back_to_its_defaults_is_exported_so_another_installation_follows(demo_agent: Agent) -> None:
    """The export wrote only tools disabled or carrying tags or example questions: a tool switched on again, or
    its tags cleared, was left out, and an installation importing the document kept it off (or its old tags),
    reported unchanged. Every tool its server lists is written."""
    tool = McpTool.objects.get(server__mcp_id="sds-company-data", name="ping")
    mcp_tool_update(tool=tool, actor="t", via="tests", data={"enabled": False, "tags": ["핑"]})
    elsewhere = config_export()  # another installation's, as it stands
    mcp_tool_update(tool=McpTool.objects.get(pk=tool.pk), actor="t", via="tests", data={"enabled": True, "tags": []})
    here = config_export()
    [ping] = [t for t in here["tools"] if t["tool"] == "ping"]
    assert (ping["enabled"], ping["tags"]) == (True, [])

    config_import(actor="t", document=elsewhere)  # the other installation, then this one's document
    config_import(actor="t", document=here)
    tool.refresh_from_db()
    assert (tool.enabled, tool.tags) == (True, [])
