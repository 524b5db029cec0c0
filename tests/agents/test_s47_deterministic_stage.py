"""The deterministic stage after the s47 review: an admin rule's ``tool_available`` reads the tools as the run may
call them (a published version calls only the tools it froze), as a code rule's ``ctx.mcp_tools`` and the gate do."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from agents.rule_tester import rules_trial
from agents.services import agent_version_publish
from mcpregistry.models import McpTool
from mcpregistry.services import mcp_tool_update

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # the demo MCP server: a real stdio process

BACKUP_QUERY = "A-1004 백업 조회"


def backup_rule(agent: Agent) -> DeterministicRule:
    """A rule that calls the backup tool only where it is available (the rule waits until it is)."""
    return DeterministicRule.objects.create(
        agent=agent,
        server=agent.servers.get(),
        name="백업 상태 조회",
        order=5,
        tool_name="get_asset_status_backup",
        when={"regex": r"(?P<asset_id>A-\d{4})", "any_keywords": ["백업"], "tool_available": "get_asset_status_backup"},
        params={"asset_id": "{match.asset_id}"},
    )


def switch_backup_tool(agent: Agent, *, enabled: bool) -> None:
    tool = McpTool.objects.get(server=agent.servers.get(), name="get_asset_status_backup")
    mcp_tool_update(tool=tool, actor="test-admin", via="tests", data={"enabled": enabled})


def test_a_tool_switched_on_after_publishing_is_not_available_to_the_version(demo_agent: Agent) -> None:
    """Published while its tool was off, the version froze no contract for it and its runs may not call it: the
    rule skips (its condition does not hold), as a code rule finds the tool missing from ``ctx.mcp_tools``; it
    matched, and every run of the live version failed ``deterministic:tool_unknown`` for a rule meant to wait."""
    backup_rule(demo_agent)
    switch_backup_tool(demo_agent, enabled=False)
    version = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    switch_backup_tool(demo_agent, enabled=True)

    run = Run.objects.create(agent=demo_agent, query=BACKUP_QUERY, version=version)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.SUCCEEDED, "")
    assert run.deterministic_results == []
    [decision] = [e for e in run.messages if e.get("type") == "rule" and e["rule"] == "백업 상태 조회"]
    assert (decision["matched"], decision["reason"]) == (False, "tool get_asset_status_backup not available")

    # The rule tester says the same of the version, in a dry run and through the gate.
    for execute in (False, True):
        [trial] = [
            t
            for t in rules_trial(
                agent=demo_agent,
                query=BACKUP_QUERY,
                context={},
                a2a_data=[],
                execute=execute,
                actor="tester",
                version=version,
            )
            if t.name == "백업 상태 조회"
        ]
        assert (trial.matched, trial.failed, trial.reason) == (
            False,
            False,
            "tool get_asset_status_backup not available",
        )

    # The agent as stored has the tool: there the rule calls it.
    stored = Run.objects.create(agent=demo_agent, query=BACKUP_QUERY)
    run_execute(run_id=str(stored.id))
    stored.refresh_from_db()
    assert [(r["tool"], r["args"]) for r in stored.deterministic_results] == [
        ("get_asset_status_backup", {"asset_id": "A-1004"})
    ]
