"""Publish on save and ``import_config`` after a review: an unchanged save of a rule, a tool or a contract, and
the re-import of an unchanged export, publish nothing (after a roll back they published the draft and undid it);
the same edited export imported again keeps its live version; an export cut at a line is refused; a new agent is
reported created only; a server's or an agent's name not given is not reported for its id's problem."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import, load_document
from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import (
    agent_update,
    agent_version_rollback,
    deterministic_rule_update,
)
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_tool_update, tool_contract_update
from tests.agents.test_configuration_versions import with_secrets

pytestmark = pytest.mark.django_db


def rolled_back(agent: Agent) -> AgentVersion:
    """Publish on save on (v1 live), an edit published on save (v2), then a roll back to v1 (v3, v1's content;
    the draft still holds v2's). Returns v3."""
    agent_update(agent=agent, actor="t", via="tests", data={"publish_on_save": True})
    agent_update(agent=agent, actor="t", via="tests", data={"system_prompt": "두 번째 지시"})
    v1, v2 = AgentVersion.objects.filter(agent=agent).order_by("number")
    v3 = agent_version_rollback(version=v1, actor="t", via="tests")
    assert (v3.number, v3.digest) == (3, v1.digest) and v2.number == 2
    return v3


def live_number(agent: Agent) -> int:
    agent.refresh_from_db()
    assert agent.live_version is not None
    return agent.live_version.number


def test_an_unchanged_rule_save_keeps_the_roll_back(demo_agent: Agent) -> None:
    v3 = rolled_back(demo_agent)
    rule = DeterministicRule.objects.filter(agent=demo_agent).first()
    assert rule is not None
    deterministic_rule_update(rule=rule, actor="admin", via="admin")
    assert live_number(demo_agent) == v3.number
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 3
    # A change a version freezes still publishes.
    deterministic_rule_update(rule=rule, actor="admin", via="admin", data={"answer_template": "바뀐 {result}"})
    assert live_number(demo_agent) == 4


def test_an_unchanged_tool_or_contract_save_keeps_the_roll_back(demo_agent: Agent, demo_server: McpServer) -> None:
    v3 = rolled_back(demo_agent)
    tool = McpTool.objects.filter(server=demo_server, enabled=True).order_by("name").first()
    assert tool is not None
    mcp_tool_update(tool=tool, actor="admin", via="admin")
    contract = ToolContract.objects.get(tool=tool)
    tool_contract_update(contract=contract, actor="admin", via="admin")
    # Tags are no part of a version.
    mcp_tool_update(tool=tool, actor="admin", via="admin", data={"tags": ["태그"]})
    assert live_number(demo_agent) == v3.number
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 3
    # Switching the tool off changes what a version freezes: published.
    mcp_tool_update(tool=tool, actor="admin", via="admin", data={"enabled": False})
    assert live_number(demo_agent) == 4


def test_re_importing_an_unchanged_export_keeps_the_roll_back(demo_agent: Agent) -> None:
    v3 = rolled_back(demo_agent)
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    report = config_import(document=config_export(), actor="ops", via="import_config")
    assert report.updated == [] and report.created == []
    assert live_number(demo_agent) == v3.number
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 3
    assert not AuditEvent.objects.filter(id__gt=last).exists()


@pytest.mark.slow
def test_the_same_edited_export_imported_again_keeps_its_live_version(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    assert live_number(demo_agent) == 1
    document = config_export()
    entry = next(a for a in document["agents"] if a["slug"] == demo_agent.slug)
    assert entry["live_version"] is None  # the draft published on save: no choice of a version
    entry["system_prompt"] = "가져온 지시"
    lives = []
    for _ in range(4):
        config_import(document=document, actor="ops", via="import_config")
        lives.append(live_number(demo_agent))
    assert lives == [2, 2, 2, 2]


def test_an_export_cut_at_a_line_is_refused(demo_agent: Agent, tmp_path: Path) -> None:
    whole = tmp_path / "w.yaml"
    call_command("export_config", "--format", "yaml", "-o", str(whole), stderr=io.StringIO())
    lines = whole.read_text(encoding="utf-8").splitlines(keepends=True)
    cut_at = next(i for i, line in enumerate(lines) if "value: none" in line)
    cut = tmp_path / "trunc.yaml"
    cut.write_text("".join(lines[: cut_at + 1]), encoding="utf-8")
    with pytest.raises(CommandError, match="cut short"):
        call_command("import_config", "--dry-run", str(cut), stdout=io.StringIO())
    # The whole export, JSON or YAML, still imports as itself; a document without the export's header too.
    whole_json = tmp_path / "w.json"
    call_command("export_config", "-o", str(whole_json), stderr=io.StringIO())
    for path in (whole, whole_json):
        document = load_document(path)
        assert next(iter(document)) == "export_format" and list(document)[-1] == "end"
        report = config_import(document=with_secrets(document), actor="ops", via="import_config")
        assert report.created == [] and report.updated == []
    assert config_export() == load_document(whole_json) == load_document(whole)
    hand_written = {key: value for key, value in load_document(whole).items() if key not in ("export_format", "end")}
    config_import(document=with_secrets(hand_written), actor="ops", via="import_config")
    with pytest.raises(ApplicationError, match="cut short"):
        config_import(document={**hand_written, "export_format": 1}, actor="ops", via="import_config")


def test_a_new_agent_with_publish_on_save_is_reported_created_only(demo_server: McpServer) -> None:
    document = {
        "agents": [
            {
                "slug": "kr-agent",
                "name": "KR",
                "servers": [demo_server.mcp_id],
                "model": {"provider": "offline"},
                "publish_on_save": True,
            }
        ]
    }
    report = config_import(document=document, actor="ops", via="import_config")
    assert "agent kr-agent" in report.created
    assert not [line for line in report.updated if line.startswith("agent kr-agent")]
    assert live_number(Agent.objects.get(slug="kr-agent")) == 1


@pytest.mark.parametrize("mcp_id", ["", "s" * 300])
def test_a_server_name_not_given_is_not_reported_for_its_id(db: Any, mcp_id: str) -> None:
    document = {"servers": [{"mcp_id": mcp_id, "transport": "stdio", "command": "python"}]}
    with pytest.raises(ApplicationError) as refused:
        config_import(document=document, actor="ops", via="import_config")
    assert "mcp_id" in refused.value.message and "name:" not in refused.value.message
    # A name given is still checked.
    document["servers"][0]["name"] = "n" * 300
    with pytest.raises(ApplicationError) as refused:
        config_import(document=document, actor="ops", via="import_config")
    assert "name:" in refused.value.message


@pytest.mark.parametrize("slug", ["", "a" * 300])
def test_an_agent_name_not_given_is_not_reported_for_its_slug(demo_server: McpServer, slug: str) -> None:
    document = {"agents": [{"slug": slug, "servers": [demo_server.mcp_id], "model": {"provider": "offline"}}]}
    with pytest.raises(ApplicationError) as refused:
        config_import(document=document, actor="ops", via="import_config")
    assert "slug" in refused.value.message and "name:" not in refused.value.message


@pytest.mark.slow
def test_an_agent_page_save_that_changes_nothing_a_version_freezes_keeps_the_roll_back(
    admin_client: Any, demo_agent: Agent
) -> None:
    """A disabled rule renamed on the agent's page (its rows held back their publish to the page's end, which
    published without comparing) undid the roll back; a change a version freezes still publishes once."""
    from tests.agents.test_fix_publish_on_save_rules import agent_page, row, saved

    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("id").first()
    assert rule is not None
    DeterministicRule.objects.filter(pk=rule.pk).update(enabled=False)
    v3 = rolled_back(demo_agent)
    url, posted = agent_page(admin_client, demo_agent)
    posted[f"{row(posted, demo_agent, rule)}-name"] = ["꺼진 규칙"]
    saved(admin_client, url, posted)
    rule.refresh_from_db()
    assert rule.name == "꺼진 규칙"
    assert live_number(demo_agent) == v3.number
    url, posted = agent_page(admin_client, demo_agent)
    posted["system_prompt"] = ["세 번째 지시"]
    saved(admin_client, url, posted)
    assert live_number(demo_agent) == v3.number + 1


@pytest.mark.parametrize("value", [2, "1", True, None])
def test_an_export_format_this_installation_does_not_write_is_refused(demo_agent: Agent, value: Any) -> None:
    document = config_export()
    document["export_format"] = value
    with pytest.raises(ApplicationError, match="is not a format this installation reads"):
        config_import(document=document, actor="ops", via="import_config")
