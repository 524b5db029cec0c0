"""Versions through export and import, as a review found them: two rules of one name keep their own identity in
an imported version (an approved write runs), an installation's export whose version names a deleted server
imports into an empty installation with a warning and exports the same document again, and a roll back while
weighted A/B arms take the traffic says so."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.messages import WARNING
from django.core.management import call_command
from django.test import Client

from agent_platform.errors import ApplicationError
from agents.approvals import approval_decide
from agents.configuration import config_export, config_import
from agents.execution import run_execute
from agents.models import Agent, AgentArm, Approval, DeterministicRule, Run
from agents.services import (
    agent_arm_create,
    agent_update,
    agent_version_import,
    agent_version_publish,
    deterministic_rule_create,
    deterministic_rule_update,
    run_create,
)
from agents.versions import version_rules
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_delete
from tests.agents.test_configuration_versions import agent_entry, emptied, with_secrets
from tests.conftest import discover_as_admin

pytestmark = pytest.mark.django_db

NOTE_QUERY = "A-1001 메모해 주세요"


@pytest.fixture
def notes_server(db: Any, tmp_path: Path) -> Iterator[McpServer]:
    """The probe server over stdio, discovered: its ``append_note`` is a write to ``NOTES_FILE``."""
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(tmp_path / "notes.txt")},
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    yield server
    get_default_pool().close("notes")


def with_notes_file(document: dict[str, Any], notes_file: Path) -> dict[str, Any]:
    """The export as an operator imports it elsewhere: the secrets given, the notes server's file among them."""
    document = with_secrets(document)
    for server in document["servers"]:
        if server["mcp_id"] == "notes":
            server["env"]["NOTES_FILE"] = {"value": str(notes_file)}
    return document


def two_rules_named_memo(agent: Agent, notes: McpServer) -> None:
    """Two rules named "메모" for one question: the first reads the asset's status, the second writes a note."""
    agent_update(agent=agent, actor="t", via="tests", servers=[*agent.servers.all(), notes])
    demo = McpServer.objects.get(mcp_id="sds-company-data")
    for order, server, tool, params in (
        (1, demo, "get_asset_status", {"asset_id": "A-1001"}),
        (2, notes, "append_note", {"text": "{query}"}),
    ):
        data = {"agent": agent, "name": "메모", "order": order, "server": server, "tool_name": tool}
        data |= {"when": {"any_keywords": ["메모해"]}, "params": params}
        deterministic_rule_create(actor="t", via="tests", data=data)


# --- 1. two rules of one name keep their own identity ---------------------------------------------------------


@pytest.mark.slow
def test_an_imported_versions_rules_of_one_name_are_matched_by_occurrence_and_an_approved_write_runs(
    demo_agent: Agent, notes_server: McpServer, tmp_path: Path
) -> None:
    two_rules_named_memo(demo_agent, notes_server)
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    exported = config_export()
    emptied()
    notes_file = tmp_path / "imported-notes.txt"
    config_import(actor="t", document=with_notes_file(exported, notes_file))

    agent = Agent.objects.get(slug="company-assistant")
    local = dict(DeterministicRule.objects.filter(agent=agent, name="메모").values_list("tool_name", "pk"))
    frozen = [(r["tool_name"], r["rule_id"]) for r in agent.live_version.content["rules"] if r["name"] == "메모"]  # type: ignore[union-attr]
    assert frozen == [("get_asset_status", local["get_asset_status"]), ("append_note", local["append_note"])]

    run = run_create(agent_slug=agent.slug, query=NOTE_QUERY, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = Approval.objects.get(run=run)
    assert (approval.tool, approval.call_id) == ("append_note", f"rule:{local['append_note']}")
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="admin:reviewer")
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    approval.refresh_from_db()
    assert (run.status, approval.status) == (Run.Status.SUCCEEDED, Approval.Status.EXECUTED)
    results = {(r["rule_id"], r["tool"], r["ok"]) for r in run.deterministic_results}
    assert {(local["get_asset_status"], "get_asset_status", True), (local["append_note"], "append_note", True)} <= (
        results
    )
    assert notes_file.read_text(encoding="utf-8").startswith(NOTE_QUERY)
    written = AuditEvent.objects.filter(run_id=run.id, action="tool.call", tool="append_note", ok=True)
    assert list(written.values_list("call_id", flat=True)) == [f"rule:{local['append_note']}"]


def test_a_frozen_rule_with_no_namesake_of_its_occurrence_here_gets_an_id_of_its_own(demo_agent: Agent) -> None:
    # Three rules named "메모" were frozen where the version was published; this installation has one.
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="get_asset_status")
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"name": "메모"})
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests", make_live=False)
    content = copy.deepcopy(published.content)
    frozen = {k: v for k, v in next(r for r in content["rules"] if r["rule_id"] == rule.pk).items() if k != "rule_id"}
    content["rules"] = [frozen, frozen, frozen]

    imported = agent_version_import(agent=demo_agent, number=9, content=content, note="", actor="t", via="tests")

    assert [r["rule_id"] for r in imported.content["rules"]] == [rule.pk, None, None]
    assert [r.rule_id for r in version_rules(imported.content)] == [rule.pk, -2, -3]


# --- 2. a version naming a deleted server -----------------------------------------------------------------------


def export_after_the_notes_server_was_deleted(agent: Agent, notes: McpServer) -> dict[str, Any]:
    """v1 binds the notes server; the agent unbinds it and the server is deleted: v1 stays live and runs."""
    agent_update(agent=agent, actor="t", via="tests", servers=[*agent.servers.all(), notes])
    agent_version_publish(agent=agent, actor="t", via="tests")
    agent_update(agent=agent, actor="t", via="tests", servers=[McpServer.objects.get(mcp_id="sds-company-data")])
    mcp_server_delete(server=McpServer.objects.get(mcp_id="notes"), actor="t", via="tests")
    exported = config_export()
    assert agent_entry(exported)["live_version"] == 1
    assert "notes" in agent_entry(exported)["versions"][0]["content"]["servers"]
    return exported


@pytest.mark.slow
def test_an_export_whose_version_names_a_deleted_server_imports_with_a_warning_and_exports_again(
    demo_agent: Agent, notes_server: McpServer
) -> None:
    exported = export_after_the_notes_server_was_deleted(demo_agent, notes_server)
    emptied()

    report = config_import(actor="t", document=with_secrets(exported))

    assert report.warnings == [
        "version company-assistant v1 names MCP server 'notes' (servers, contracts.notes/append_note, "
        "contracts.notes/big_text, …), which does not exist here: imported as published; its runs leave that "
        "server out"
    ]
    assert config_export() == exported
    agent = Agent.objects.get(slug="company-assistant")
    run = run_create(agent_slug=agent.slug, query="A-1001 자산의 현재 상태를 알려주세요.", api_key=None)
    assert run.version is not None and run.version.number == 1
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message


@pytest.mark.slow
def test_import_config_prints_the_warning(demo_agent: Agent, notes_server: McpServer, tmp_path: Path) -> None:
    exported = export_after_the_notes_server_was_deleted(demo_agent, notes_server)
    emptied()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(with_secrets(exported), ensure_ascii=False), encoding="utf-8")
    out = StringIO()
    call_command("import_config", str(path), stdout=out)
    assert "warning: version company-assistant v1 names MCP server 'notes' (servers," in out.getvalue()


def test_a_version_with_a_missing_server_and_another_problem_is_still_refused(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    doc = config_export()
    version = copy.deepcopy(agent_entry(doc)["versions"][0])
    version["content"]["servers"] = ["nowhere"]
    version["content"]["agent"]["max_iterations"] = "5"
    doc["agents"].append({"slug": "ghost", "servers": [], "versions": [version], "live_version": version["number"]})
    with pytest.raises(ApplicationError, match=r"agents\[1\] \(ghost\): versions: v1: agent.max_iterations"):
        config_import(actor="t", document=doc)
    assert not Agent.objects.filter(slug="ghost").exists()


# --- 3. a roll back while weighted arms take the traffic -----------------------------------------------------------


def roll_back_to_v1(admin_client: Client, agent: Agent, *, weight: int) -> list[Any]:
    """v1, then v2 (a bad answer) as arm "only" of ``weight``; the admin rolls back to v1. Returns the messages."""
    v1 = agent_version_publish(agent=agent, actor="t", via="tests")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"answer_template": "BAD {result.asset_id}"})
    v2 = agent_version_publish(agent=agent, actor="t", via="tests")
    agent_arm_create(actor="t", via="tests", data={"agent": agent, "name": "only", "version": v2, "weight": weight})
    response = admin_client.post(
        "/admin/agents/agentversion/", {"action": "rollback", "_selected_action": [v1.pk]}, follow=True
    )
    agent.refresh_from_db()
    assert (agent.live_version.number, agent.live_version.digest) == (3, v1.digest)  # type: ignore[union-attr]
    return list(response.context["messages"])


def test_a_roll_back_while_weighted_arms_take_the_traffic_warns_that_they_still_do(
    admin_client: Client, demo_agent: Agent
) -> None:
    (message,) = roll_back_to_v1(admin_client, demo_agent, weight=1)
    assert message.level == WARNING
    assert str(message) == (
        "Agent company-assistant: v1 published again as v3, the live version, but live traffic still follows the "
        "A/B arms only (v2) until their weights are set to 0."
    )
    assert AgentArm.objects.get(agent=demo_agent).weight == 1  # the roll back leaves the arms alone


def test_a_roll_back_with_arms_of_weight_zero_is_live_at_once(admin_client: Client, demo_agent: Agent) -> None:
    (message,) = roll_back_to_v1(admin_client, demo_agent, weight=0)
    assert str(message) == "Agent company-assistant: v1 published again as v3, now live."


def test_a_frozen_rule_never_takes_the_id_of_a_rule_that_calls_something_else(demo_server: McpServer) -> None:
    """Matched by name and occurrence, a rule of the name disabled here shifted the match: the frozen rule calling
    search_employee took the id of the one calling list_projects (its audit events and the run page then named
    the wrong rule)."""
    from agents.versions import version_content_portable, version_rule_ids
    from tests.conftest import make_agent

    agent = make_agent(slug="same-names", servers=[demo_server], with_demo_rules=False)
    first, second = (
        DeterministicRule.objects.create(
            agent=agent, server=demo_server, name="조회", order=order, tool_name=tool, when={"any_keywords": [k]}
        )
        for order, tool, k in ((1, "search_employee", "a"), (2, "list_projects", "b"))
    )
    portable = version_content_portable(copy.deepcopy(agent_version_publish(agent=agent, actor="t", via="t").content))
    DeterministicRule.objects.filter(pk=first.pk).update(enabled=False)  # this installation has it off

    assert version_rule_ids(agent, portable) == [None, second.pk]
