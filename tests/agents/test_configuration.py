"""Configuration as code: import is idempotent and all-or-nothing; export writes no secret value."""

from __future__ import annotations

import json
import sys
from io import StringIO

import pytest
import yaml
from django.conf import settings
from django.core.management import CommandError, call_command

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer, McpTool, ToolContract

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _docs_token_may_be_passed_through(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["DOCS_TOKEN"]


SECRET = "sk-live-config-secret-9a8b7c6d5e4f"


def document() -> dict:
    return {
        "servers": [
            {
                "mcp_id": "company",
                "name": "Company data",
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
                "cwd": str(settings.BASE_DIR),
                "env": {"INTERNAL_API_KEY": {"value": SECRET}, "FAILURE_MODE": {"value": "none"}},
                "timeout_s": 10,
                "session_scope": "shared",
            },
            {
                "mcp_id": "docs",
                "transport": "streamable_http",
                "url": "http://127.0.0.1:9000/mcp",
                "headers": {"Authorization": {"from_env": "DOCS_TOKEN"}},
            },
        ],
        "contracts": [
            {
                "mcp_id": "company",
                "tool": "get_asset_status",
                "args": {"asset_id": {"type": "str", "required": True, "pattern": "^A-[0-9]{4}$"}},
                "returns": {"required": ["status"]},
                "retry": {"max_attempts": 3, "on": ["timeout", "rate_limit", "transport"]},
                "timeout_s": 5,
                "fallback": "get_asset_status_backup",
                "risk": "read",
            }
        ],
        "agents": [
            {
                "slug": "assistant",
                "name": "비서",
                "model": {"provider": "offline"},
                "servers": ["company"],
                "system_prompt": "회사 정보를 답합니다.",
                "max_iterations": 4,
            }
        ],
        "rules": [
            {
                "agent": "assistant",
                "name": "소속 조회",
                "order": 10,
                "mcp_id": "company",
                "tool": "search_employee",
                "when": {"regex": "(?P<name>[가-힣]{2,4}) 님", "any_keywords": ["소속"]},
                "params": {"name": "{match.name}"},
            }
        ],
    }


def test_an_import_creates_everything_and_a_second_changes_nothing() -> None:
    first = config_import(actor="test", document=document())
    assert len(first.created) == 6 and not first.updated  # the tool its contract registers is a line of its own
    server = McpServer.objects.get(mcp_id="company")
    assert server.env["INTERNAL_API_KEY"] == SECRET
    assert McpServer.objects.get(mcp_id="docs").headers == {"Authorization": {"from_env": "DOCS_TOKEN"}}
    contract = ToolContract.objects.get(tool__name="get_asset_status")
    assert contract.args["asset_id"]["pattern"] == "^A-[0-9]{4}$"
    assert contract.fallback_tool == "get_asset_status_backup"
    assert list(Agent.objects.get(slug="assistant").servers.values_list("mcp_id", flat=True)) == ["company"]
    assert DeterministicRule.objects.get(name="소속 조회").params == {"name": "{match.name}"}

    second = config_import(actor="test", document=document())
    assert not second.created and not second.updated
    assert len(second.unchanged) == 5


def test_a_changed_entry_is_reported_as_updated() -> None:
    config_import(actor="test", document=document())
    changed = document()
    changed["agents"][0]["max_iterations"] = 8
    report = config_import(actor="test", document=changed)
    assert report.updated == ["agent assistant (max_iterations)"]


def test_a_bad_entry_imports_nothing_and_is_named() -> None:
    bad = document()
    bad["servers"][1]["url"] = "ftp://nowhere/mcp"
    with pytest.raises(ApplicationError) as exc:
        config_import(actor="test", document=bad)
    assert "servers[1] (docs)" in exc.value.message
    assert not McpServer.objects.exists() and not Agent.objects.exists()


def test_a_schema_error_names_the_entry_and_the_field() -> None:
    bad = document()
    bad["contracts"][0]["risk"] = "maybe"
    with pytest.raises(ApplicationError) as exc:
        config_import(actor="test", document=bad)
    assert "contracts[0] (company.get_asset_status).risk" in exc.value.message


def test_a_rule_for_an_unknown_server_is_refused() -> None:
    bad = document()
    bad["rules"][0]["mcp_id"] = "ghost"
    with pytest.raises(ApplicationError) as exc:
        config_import(actor="test", document=bad)
    assert "rules[0] (assistant.소속 조회): unknown server 'ghost'" in exc.value.message
    assert not DeterministicRule.objects.exists()


def test_export_writes_no_secret_value_and_round_trips() -> None:
    config_import(actor="test", document=document())
    exported = config_export()
    text = json.dumps(exported, ensure_ascii=False)
    assert SECRET not in text
    company = next(s for s in exported["servers"] if s["mcp_id"] == "company")
    assert company["env"]["INTERNAL_API_KEY"] == {"set": True}
    docs = next(s for s in exported["servers"] if s["mcp_id"] == "docs")
    assert docs["headers"]["Authorization"] == {"from_env": "DOCS_TOKEN"}
    report = config_import(actor="test", document=exported)
    assert not report.created and not report.updated
    assert McpServer.objects.get(mcp_id="company").env["INTERNAL_API_KEY"] == SECRET


def test_keeping_a_secret_that_was_never_stored_is_an_error() -> None:
    bad = document()
    bad["servers"][0]["env"]["INTERNAL_API_KEY"] = {"set": True}
    with pytest.raises(ApplicationError, match="no value is stored"):
        config_import(actor="test", document=bad)


def test_the_commands_import_yaml_and_export_json(tmp_path) -> None:
    path = tmp_path / "platform.yaml"
    path.write_text(yaml.safe_dump(document(), allow_unicode=True), encoding="utf-8")
    out = StringIO()
    call_command("import_config", str(path), stdout=out)
    assert "created 6" in out.getvalue()
    out = StringIO()
    call_command("export_config", stdout=out)
    assert json.loads(out.getvalue())["agents"][0]["name"] == "비서"
    assert SECRET not in out.getvalue()


def test_the_import_command_fails_with_the_reasons(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("import_config", str(path))


def test_a_dry_run_changes_nothing() -> None:
    report = config_import(actor="test", document=document(), dry_run=True)
    assert len(report.created) == 6
    assert not McpServer.objects.exists() and not McpTool.objects.exists()


@pytest.mark.slow
def test_an_imported_binding_is_discovered_and_answers() -> None:
    from agents.execution import run_execute
    from agents.models import Run
    from tests.conftest import discover_as_admin

    config_import(actor="test", document=document())
    assert discover_as_admin(server=McpServer.objects.get(mcp_id="company")).ok
    run = Run.objects.create(agent=Agent.objects.get(slug="assistant"), query="정하은 님 소속이 어디예요?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert "클라우드운영팀" in run.answer


def test_a_local_tools_binding_round_trips_through_export_and_import() -> None:
    doc = {
        "servers": [
            {"mcp_id": "local", "name": "로컬 도구", "transport": "local", "args": ["mcpregistry.builtin_tools"]}
        ],
        "agents": [{"slug": "calc", "servers": ["local"]}],
    }
    config_import(actor="test", document=doc)
    exported = config_export()
    [local] = [s for s in exported["servers"] if s["mcp_id"] == "local"]
    assert (local["transport"], local["args"]) == ("local", ["mcpregistry.builtin_tools"])
    report = config_import(actor="test", document=exported)
    assert not report.created and not report.updated


def test_an_openai_compatible_agent_and_its_model_key_round_trip_without_the_key() -> None:
    doc = document()
    doc["agents"].append(
        {
            "slug": "local-llm",
            "servers": [],
            "model": {
                "provider": "openai_compatible",
                "model_id": "qwen2.5:7b",
                "params": {"base_url": "http://127.0.0.1:11434/v1"},
                "secrets": {"api_key": {"value": SECRET}},
            },
        }
    )
    config_import(actor="test", document=doc)
    agent = Agent.objects.get(slug="local-llm")
    assert agent.model_api_key() == SECRET
    exported = config_export()
    assert SECRET not in json.dumps(exported, ensure_ascii=False)
    local = next(a for a in exported["agents"] if a["slug"] == "local-llm")
    assert local["model"]["secrets"] == {"api_key": {"set": True}}
    report = config_import(actor="test", document=exported)
    assert not report.created and not report.updated
    agent.refresh_from_db()
    assert agent.model_api_key() == SECRET


def test_tool_tags_and_example_queries_round_trip_through_the_audited_service() -> None:
    from audit.models import AuditEvent

    doc = document()
    doc["tools"] = [
        {
            "mcp_id": "company",
            "tool": "get_asset_status",
            "tags": ["asset", "자산"],
            "example_queries": ["A-1001 자산 상태 알려줘"],
        }
    ]
    first = config_import(actor="tester", document=doc)
    assert "tool company.get_asset_status" in first.created
    tool = McpTool.objects.get(server__mcp_id="company", name="get_asset_status")
    assert (tool.tags, tool.example_queries) == (["asset", "자산"], ["A-1001 자산 상태 알려줘"])
    event = AuditEvent.objects.get(action="config.mcp_tool.create", tool="get_asset_status")
    assert event.actor == "tester"

    exported = config_export()
    assert exported["tools"] == [{**doc["tools"][0], "enabled": True}]
    again = config_import(actor="tester", document=exported)
    assert "tool company.get_asset_status" in again.unchanged and not again.updated

    exported["tools"][0]["tags"] = ["asset"]
    changed = config_import(actor="tester", document=exported)
    assert changed.updated == ["tool company.get_asset_status"]
    assert McpTool.objects.get(pk=tool.pk).tags == ["asset"]
    assert AuditEvent.objects.filter(action="config.mcp_tool.update", tool="get_asset_status").count() == 1


def test_a_blank_tag_or_an_unknown_server_is_named() -> None:
    doc = document()
    doc["tools"] = [{"mcp_id": "company", "tool": "search_employee", "tags": ["  "]}]
    with pytest.raises(ApplicationError) as exc:
        config_import(actor="test", document=doc)
    assert "tools[0] (company.search_employee).tags.0" in exc.value.message
    doc["tools"] = [{"mcp_id": "ghost", "tool": "search_employee", "tags": ["사원"]}]
    with pytest.raises(ApplicationError) as exc:
        config_import(actor="test", document=doc)
    assert "tools[0] (ghost.search_employee): unknown server 'ghost'" in exc.value.message
    assert not McpTool.objects.exists()


@pytest.mark.slow
def test_an_agents_selection_and_context_import_before_their_servers_are_discovered() -> None:
    # A new installation's import binds servers it has not connected to: what their tools and resources are is not
    # known yet, so settings that name them are not refused (the services check them once the servers are known).
    doc = document()
    doc["agents"][0]["tool_selection"] = {"enabled": True, "top_k": 2, "pinned": ["search_employee"]}
    doc["agents"][0]["mcp_context"] = {"resources": [{"mcp_id": "company", "uri": "company://handbook"}]}
    config_import(document=doc, actor="ops", via="import_config")
    agent = Agent.objects.get(slug="assistant")
    assert agent.tool_selection["pinned"] == ["search_employee"]
    assert agent.mcp_context["resources"][0]["uri"] == "company://handbook"
    # The same document again changes nothing, whatever the servers turned out to offer.
    from mcpregistry.services import mcp_server_discover

    assert mcp_server_discover(server=McpServer.objects.get(mcp_id="company"), actor="ops", via="tests").ok
    again = config_import(document=doc, actor="ops", via="import_config")
    assert not again.created and not again.updated
