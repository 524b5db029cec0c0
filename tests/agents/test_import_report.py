"""An import's report accounts for every change it audits, and a refused agent entry names all its problems at once
(``agents.configuration``)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.models import Agent
from audit.models import AuditEvent
from mcpregistry.models import McpTool

pytestmark = pytest.mark.django_db

DOCS_SERVER = {"mcp_id": "docs", "transport": "streamable_http", "url": "https://docs.example.com/mcp"}
DOCS_CONTRACT = {"mcp_id": "docs", "tool": "search_docs", "risk": "read"}


def actions_since(last_id: int) -> list[str]:
    return list(AuditEvent.objects.filter(id__gt=last_id).order_by("id").values_list("action", flat=True))


def last_event_id() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def refusal(document: dict) -> list[str]:
    """The problem lines of a refused import."""
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=document)
    return refused.value.message.splitlines()[1:]


def problems_of(lines: list[str], where: str) -> list[str]:
    return [line.removeprefix(f"{where}: ") for line in lines if line.startswith(f"{where}: ")]


# --- the report names every change it audits ------------------------------------------------------------------


def test_a_tool_registered_for_a_contract_is_reported_beside_its_audit_event() -> None:
    last = last_event_id()
    report = config_import(actor="test", document={"servers": [DOCS_SERVER], "contracts": [DOCS_CONTRACT]})
    assert report.created == ["server docs", "tool docs.search_docs", "contract docs.search_docs"]
    assert actions_since(last) == ["config.mcp_server.create", "config.mcp_tool.create", "config.tool_contract.create"]


def test_a_tool_the_tools_section_registers_is_reported_once() -> None:
    last = last_event_id()
    report = config_import(
        actor="test",
        document={
            "servers": [DOCS_SERVER],
            "tools": [{"mcp_id": "docs", "tool": "search_docs", "tags": ["docs"]}],
            "contracts": [DOCS_CONTRACT],
        },
    )
    assert report.created == ["server docs", "tool docs.search_docs", "contract docs.search_docs"]
    assert len(actions_since(last)) == len(report.created)


def test_a_reimport_reports_the_registered_tool_as_nothing_new() -> None:
    document = {"servers": [DOCS_SERVER], "contracts": [DOCS_CONTRACT]}
    config_import(actor="test", document=document)
    last = last_event_id()
    report = config_import(actor="test", document=document)
    assert not report.created and not report.updated and actions_since(last) == []


def test_a_dry_run_names_the_tool_it_would_register_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "platform.json"
    path.write_text(json.dumps({"servers": [DOCS_SERVER], "contracts": [DOCS_CONTRACT]}), encoding="utf-8")
    last = last_event_id()
    out = StringIO()
    call_command("import_config", str(path), "--dry-run", stdout=out)
    assert "would be created: tool docs.search_docs" in out.getvalue().splitlines()
    assert "would be created 3, updated 0, unchanged 0" in out.getvalue()
    assert actions_since(last) == [] and not McpTool.objects.exists()


# --- a refused agent entry names every problem at once -------------------------------------------------------


def test_a_new_agent_entry_names_all_its_problems_in_one_refusal(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_ALLOW_SCRIPTED_MODEL = False
    last = last_event_id()
    lines = refusal(
        {
            "servers": [DOCS_SERVER],
            "contracts": [DOCS_CONTRACT],
            "agents": [
                {
                    "slug": "Bad Slug!",
                    "answer_template": "{answer}",
                    "language": "xx",
                    "model": {"provider": "scripted", "params": {"bogus": 1}},
                    "servers": ["docs"],
                }
            ],
        }
    )
    named = [problem.split(":", 1)[0] for problem in problems_of(lines, "agents[0] (Bad Slug!)")]
    assert named == ["slug", "model_params", "language", "answer_template", "model_provider"]
    assert "(found: {answer})" in problems_of(lines, "agents[0] (Bad Slug!)")[3]
    assert not Agent.objects.exists() and not McpTool.objects.exists() and actions_since(last) == []


def test_an_entry_refused_for_an_unknown_server_names_its_own_problems_too() -> None:
    lines = refusal(
        {
            "agents": [
                {
                    "slug": "flows",
                    "servers": ["ghost"],
                    "mode": "flow",
                    "flow_graph": "nope.module",
                    "language": "xx",
                    "answer_template": "{answer}",
                }
            ]
        }
    )
    problems = problems_of(lines, "agents[0] (flows)")
    assert problems[0] == "unknown server(s): ghost"
    # The flow graph stays refused at its default beside mode "flow": the mode is set aside with it, and the
    # checks after it still run.
    assert [problem.split(":", 1)[0] for problem in problems[1:]] == ["flow_graph", "language", "answer_template"]
    assert not Agent.objects.exists()


def test_a_valid_entry_with_an_unknown_server_is_refused_for_the_server_alone() -> None:
    lines = refusal({"agents": [{"slug": "helper", "servers": ["ghost"], "language": "en"}]})
    assert lines == ["agents[0] (helper): unknown server(s): ghost"]


@pytest.mark.slow
def test_a_stored_agents_entry_names_all_its_problems_and_changes_nothing() -> None:
    config_import(actor="test", document={"agents": [{"slug": "helper", "system_prompt": "as stored"}]})
    last = last_event_id()
    lines = refusal(
        {
            "agents": [
                {
                    "slug": "helper",
                    "system_prompt": "changed",
                    "language": "xx",
                    "answer_template": "{bogus}",
                    "model": {"params": {"bogus": 1}},
                }
            ]
        }
    )
    named = [problem.split(":", 1)[0] for problem in problems_of(lines, "agents[0] (helper)")]
    assert named == ["model_params", "language", "answer_template"]
    helper = Agent.objects.get(slug="helper")
    assert (helper.system_prompt, helper.language, helper.answer_template) == ("as stored", "ko", "")
    assert actions_since(last) == []
