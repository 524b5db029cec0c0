"""An import or a discovery that takes a tool out of the runs' reach names the enabled rules it leaves failing,
as the tool's and the server's admin pages do (``agents.rule_dependents``): before, a tool switched off by
``import_config`` or vanished at ``mcp_discover`` left its rules enabled with nothing said, and every run they
matched failed ``deterministic:tool_unknown``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from agents.configuration import config_import
from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_discover
from tests.mcpregistry.test_registry import mutable_server

pytestmark = pytest.mark.django_db

SEARCH_RULE = "직원 소속 조회"  # a demo rule calling search_employee


def failing_warnings(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "until the rule is changed or switched off" in w]


def test_an_import_switching_a_tool_off_names_the_rules_it_leaves_failing(demo_agent: Agent) -> None:
    document = {"tools": [{"mcp_id": "sds-company-data", "tool": "search_employee", "enabled": False}]}
    report = config_import(actor="test", document=document)
    assert not McpTool.objects.get(name="search_employee").enabled
    assert failing_warnings(report.warnings) == [
        f"Rule '{SEARCH_RULE}' (company-assistant) calls search_employee, which runs cannot call now: every run the "
        "rule matches fails deterministic:tool_unknown until the rule is changed or switched off, or the tool "
        "enabled again."
    ]
    # Failing before this import: not its doing, not named again.
    assert failing_warnings(config_import(actor="test", document=document).warnings) == []


def test_a_dry_run_names_them_and_changes_nothing(demo_agent: Agent) -> None:
    document = {"tools": [{"mcp_id": "sds-company-data", "tool": "search_employee", "enabled": False}]}
    report = config_import(actor="test", document=document, dry_run=True)
    assert McpTool.objects.get(name="search_employee").enabled
    assert len(failing_warnings(report.warnings)) == 1


def test_an_import_switching_a_server_off_names_each_rule_of_it(demo_agent: Agent) -> None:
    report = config_import(actor="test", document={"servers": [{"mcp_id": "sds-company-data", "enabled": False}]})
    assert not McpServer.objects.get(mcp_id="sds-company-data").enabled
    named = failing_warnings(report.warnings)
    rules = DeterministicRule.objects.filter(agent=demo_agent, enabled=True)
    assert len(named) == len([r for r in rules if not r.when.get("tool_available")]) > 0
    assert all("of the disabled server sds-company-data" in line for line in named)
    assert any(f"Rule '{SEARCH_RULE}'" in line for line in named)


def test_an_import_switching_on_a_rule_whose_tool_is_off_names_it(demo_agent: Agent) -> None:
    McpTool.objects.filter(name="search_employee").update(enabled=False)
    DeterministicRule.objects.filter(name=SEARCH_RULE).update(enabled=False)
    report = config_import(
        actor="test",
        document={
            "rules": [
                {
                    "agent": "company-assistant",
                    "name": SEARCH_RULE,
                    "mcp_id": "sds-company-data",
                    "tool": "search_employee",
                    "enabled": True,
                    "when": {"regex": "(?P<name>[가-힣]{2,4}) 님"},
                    "params": {"name": "{match.name}"},
                }
            ]
        },
    )
    assert [line.split(" calls ")[0] for line in failing_warnings(report.warnings)] == [
        f"Rule '{SEARCH_RULE}' (company-assistant)"
    ]


def test_the_import_command_prints_them_as_warnings(demo_agent: Agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "off.json"
    path.write_text(
        '{"tools": [{"mcp_id": "sds-company-data", "tool": "search_employee", "enabled": false}]}', encoding="utf-8"
    )
    out = StringIO()
    call_command("import_config", str(path), stdout=out)
    assert f"warning: Rule '{SEARCH_RULE}' (company-assistant) calls search_employee" in out.getvalue()


@pytest.mark.slow
def test_a_discovery_in_which_a_tool_vanished_names_the_rules_calling_it() -> None:
    server = mutable_server(EXTRA_TOOL="1")
    agent = Agent.objects.create(slug="mutable-agent", name="m")
    agent.servers.set([server])
    DeterministicRule.objects.create(
        agent=agent, server=server, name="추가 도구", order=10, tool_name="extra", when={"any_keywords": ["추가"]}
    )
    server.env = {}
    server.save()
    get_default_pool().close(server.mcp_id)
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok and report.vanished == ["extra"]
    assert report.rules_left == [
        "Rule '추가 도구' (mutable-agent) calls extra, which runs cannot call now: every run the rule matches fails "
        "deterministic:tool_unknown until the rule is changed or switched off, or the tool enabled again."
    ]
    out = StringIO()
    call_command("mcp_discover", "mutable", stdout=out)  # listed the same again: nothing taken out, nothing named
    assert "추가 도구" not in out.getvalue()


@pytest.mark.slow
def test_a_discovery_names_no_rule_that_was_failing_before_it() -> None:
    """A tool already held for a review whose listing changed again is held again: its rules failed before this
    discovery, which does not name them again (as an import names only the rules it leaves failing)."""
    server = mutable_server(TOOL_DESCRIPTION="Looks a key up.")
    agent = Agent.objects.create(slug="mutable-agent", name="m")
    agent.servers.set([server])
    DeterministicRule.objects.create(
        agent=agent, server=server, name="조회", order=10, tool_name="lookup", when={"any_keywords": ["조회"]}
    )
    for description in ("Looks a key up, changed.", "Looks a key up, changed again."):
        server.env = {"TOOL_DESCRIPTION": description}
        server.save()
        get_default_pool().close(server.mcp_id)
        report = mcp_server_discover(server=server, actor="test", via="tests")
        assert report.ok and report.review_required == ["lookup"]
        if description.endswith("changed."):
            assert [line.split(" calls ")[0] for line in report.rules_left] == ["Rule '조회' (mutable-agent)"]
        else:
            assert report.rules_left == []
