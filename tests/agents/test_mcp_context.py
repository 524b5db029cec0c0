"""MCP resources and prompts (seed 003 §3.1) from a third-party server, ``server-everything`` over stdio: an
agent attaches resources as context read at run start, uses an MCP prompt as its system prompt (arguments from
the run's context), and lets the model read the bound servers' resources with a ``read_resource`` tool. All of
it goes through the gate: audited, size-capped. Only the model is scripted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from django.core.exceptions import ValidationError

from agents.answers import TOOL_DATA_NOTICE
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_update
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

if TYPE_CHECKING:
    from tests.thirdparty import EverythingServer

pytest_plugins = ["tests.thirdparty"]
pytestmark = [pytest.mark.django_db, pytest.mark.thirdparty]

ARCHITECTURE = "demo://resource/static/document/architecture.md"


@pytest.fixture
def everything(everything_server: EverythingServer) -> Iterator[McpServer]:
    command = everything_server.stdio()
    server = McpServer.objects.create(
        mcp_id="everything",
        name="everything",
        transport=McpServer.Transport.STDIO,
        command=command.command,
        args=command.args,
        timeout_s=20,
    )
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    server.refresh_from_db()
    yield server
    get_default_pool().close("everything")


def agent_with(server: McpServer, mcp_context: dict, script: list[dict]) -> Agent:
    agent = make_agent(slug="ctx", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    return agent_update(agent=agent, actor="admin", via="tests", data={"mcp_context": mcp_context})


def submit(agent: Agent, query: str, context: dict | None = None) -> Run:
    run = Run.objects.create(agent=agent, query=query, context=context or {})
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def system_text(run: Run) -> str:
    return next(m["data"]["content"] for m in run.conversation if m["type"] == "system")


def test_discovery_lists_the_servers_resources_and_prompts(everything: McpServer) -> None:
    assert ARCHITECTURE in {r["uri"] for r in everything.resources}
    assert {"simple-prompt", "args-prompt"} <= {p["name"] for p in everything.prompts}


def test_resources_are_read_at_run_start_through_the_gate_and_attached_as_context(everything: McpServer) -> None:
    agent = agent_with(
        everything,
        {"resources": [{"mcp_id": "everything", "uri": ARCHITECTURE}]},
        [{"content": "ok"}],
    )
    run = submit(agent, "설계 문서를 요약해줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    (entry,) = [m for m in run.messages if m.get("type") == "resource"]
    assert entry["ok"] and entry["chars"] > 100
    # Attached as data: inside the <tool_data> block, after the notice that it is never instructions.
    text = system_text(run)
    assert TOOL_DATA_NOTICE in text
    block = text[text.index("<tool_data>") :]
    assert ARCHITECTURE in block and block.rstrip().endswith("</tool_data>")
    event = AuditEvent.objects.get(run_id=run.id, action="resource.read")
    assert (event.mcp_id, event.tool, event.ok, event.args) == ("everything", ARCHITECTURE, True, {"uri": ARCHITECTURE})


def test_a_resource_over_the_size_cap_is_refused_and_left_out(everything: McpServer, settings) -> None:
    settings.PLATFORM_TOOL_RESULT_MAX_CHARS = 50
    agent = agent_with(everything, {"resources": [{"mcp_id": "everything", "uri": ARCHITECTURE}]}, [{"content": "ok"}])
    run = submit(agent, "q")
    (entry,) = [m for m in run.messages if m.get("type") == "resource"]
    assert (entry["ok"], entry["error"]) == (False, "result:too_big")
    assert ARCHITECTURE not in system_text(run)
    assert AuditEvent.objects.get(run_id=run.id, action="resource.read").reason == "result:too_big"


def test_an_mcp_prompt_with_the_admins_own_arguments_is_the_system_prompt(everything: McpServer) -> None:
    agent = agent_with(
        everything,
        {"prompt": {"mcp_id": "everything", "name": "args-prompt", "arguments": {"city": "부산"}}},
        [{"content": "ok"}],
    )
    run = submit(agent, "날씨?")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    text = system_text(run)
    assert "부산" in text and "<tool_data>" not in text and agent.system_prompt[:20] not in text
    (entry,) = [m for m in run.messages if m.get("type") == "prompt"]
    assert entry["delivered"] == "system"


def test_an_mcp_prompt_with_the_calling_systems_context_is_the_system_prompt(everything: McpServer) -> None:
    agent = agent_with(
        everything,
        {"prompt": {"mcp_id": "everything", "name": "args-prompt", "arguments": {"city": "{context.city}"}}},
        [{"content": "ok"}],
    )
    run = submit(agent, "날씨?", context={"city": "서울"})

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # The calling system's context chooses the prompt's variant, as the admin's own text does.
    text = system_text(run)
    assert "서울" in text and "<tool_data>" not in text
    (entry,) = [m for m in run.messages if m.get("type") == "prompt"]
    assert entry["delivered"] == "system"
    event = AuditEvent.objects.get(run_id=run.id, action="prompt.get")
    assert (event.tool, event.ok, event.args) == ("args-prompt", True, {"city": "서울"})


def test_an_mcp_prompt_with_the_runs_data_is_attached_as_data(everything: McpServer) -> None:
    agent = agent_with(
        everything,
        {"prompt": {"mcp_id": "everything", "name": "args-prompt", "arguments": {"city": "{data.city}"}}},
        [{"content": "ok"}],
    )
    run = Run.objects.create(agent=agent, query="날씨?", a2a_data=[{"city": "부산"}])
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # What was sent with the question never becomes system instructions: the agent's own prompt stays.
    text = system_text(run)
    assert text.startswith(agent.system_prompt.strip()[:20])
    assert "부산" in text[text.index("<tool_data>") :]
    (entry,) = [m for m in run.messages if m.get("type") == "prompt"]
    assert entry["delivered"] == "data"


def test_an_unknown_prompt_falls_back_to_the_agents_own_prompt(everything: McpServer) -> None:
    from mcpregistry.services import mcp_server_update

    # Chosen while the server had it (the services refuse a prompt the server does not list); gone since.
    agent = agent_with(everything, {"prompt": {"mcp_id": "everything", "name": "simple-prompt"}}, [{"content": "ok"}])
    left = [p for p in everything.prompts if p.get("name") != "simple-prompt"]
    mcp_server_update(server=everything, actor="test", via="tests", data={"prompts": left})
    run = submit(agent, "q")
    assert run.status == Run.Status.SUCCEEDED
    (entry,) = [m for m in run.messages if m.get("type") == "prompt"]
    assert (entry["ok"], entry["error"]) == (False, "prompt:unknown")
    assert agent.system_prompt[:20] in system_text(run)


def test_the_model_reads_a_bound_servers_resource_with_the_read_resource_tool(everything: McpServer) -> None:
    agent = agent_with(
        everything,
        {"read_resource_tool": True},
        [
            {"tool_calls": [{"name": "read_resource", "args": {"uri": "file:///etc/passwd"}}]},
            {"tool_calls": [{"name": "read_resource", "args": {"uri": ARCHITECTURE}}]},
            {"content": "{last_tool_result}"},
        ],
    )
    run = submit(agent, "설계 문서 읽어줘")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    bound = next(m for m in run.conversation if m["type"] == "ai")["data"]["response_metadata"]["bound_tools"]
    assert "read_resource" in bound
    refused = AuditEvent.objects.get(run_id=run.id, tool="read_resource")
    assert (refused.ok, refused.reason) == (False, "resource:unknown")
    read = AuditEvent.objects.get(run_id=run.id, action="resource.read")
    assert (read.tool, read.ok) == (ARCHITECTURE, True)
    assert len(run.answer) > 100


def test_a_malformed_mcp_context_is_refused_by_the_service(everything: McpServer) -> None:
    agent = make_agent(slug="bad", servers=[everything], with_demo_rules=False)
    with pytest.raises(ValidationError) as caught:
        agent_update(agent=agent, actor="admin", via="tests", data={"mcp_context": {"resources": [{"uri": "x"}]}})
    assert "resources.0.mcp_id" in str(caught.value.message_dict["mcp_context"])
