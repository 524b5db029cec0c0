"""Tool names the model providers refuse (defect: a discovered tool named ``projects.list``, valid MCP, was offered
unchanged; Converse's ToolName and Chat Completions' function name are ``[a-zA-Z0-9_-]{1,64}``, so every run of
the agent failed ``model:validation``). The model is offered a safe alias, its calls to the alias reach the real
tool, and the audit and the events carry the tool's own name."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest

from agents.engine import model_tool_names
from agents.models import Run
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import mcp_server_discover
from tests.agents.test_openai_compatible import openai_agent, submit
from tests.openai_server import ScriptedOpenAIServer

PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def test_names_the_providers_take_stay_and_the_others_get_unique_safe_aliases() -> None:
    long_name = "x" * 70
    names = model_tool_names(
        [
            "search_employee",
            "projects.list",
            "projects_list2",
            "a.b",
            "a_b",
            "직원.검색",
            "직원 검색",
            long_name,
            "read.resource",
        ]
    )
    assert names["search_employee"] == "search_employee" and names["a_b"] == "a_b"
    assert names["projects.list"] == "projects_list"
    assert names["a.b"] != "a_b" and names["a.b"].startswith("a_b_")  # another tool has a_b
    assert names["read.resource"] != "read_resource"  # the platform's own tool's name
    assert names["직원.검색"] != names["직원 검색"]
    assert all(PROVIDER_NAME.fullmatch(alias) for alias in names.values())
    assert len(set(names.values())) == len(names)
    # The same tools, the same aliases (a parked run resumes with the names its conversation holds).
    assert model_tool_names(list(reversed(list(names)))) == names


@pytest.fixture
def dotted_server(db: object) -> McpServer:
    server = McpServer.objects.create(
        mcp_id="dotted",
        name="dotted",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", "tests.agents.mcp_dotted_tools_server"],
        timeout_s=10,
    )
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).update(risk="read")  # both only read: no approval
    return server


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_tool_named_projects_dot_list_is_offered_by_an_alias_and_its_calls_reach_the_real_tool(
    dotted_server: McpServer, stream: bool
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "projects_list", "args": {"team": "물류플랫폼팀"}}]},
        {"content": "프로젝트: {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, dotted_server, slug="dotted-tools", stream=stream)
        run = submit(agent, "물류플랫폼팀 프로젝트?")
    sent = [t["function"]["name"] for t in server.requests[0]["body"]["tools"]]
    assert all(PROVIDER_NAME.fullmatch(name) for name in sent), sent
    assert "projects_list" in sent
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "차세대 물류 플랫폼 구축" in run.answer
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.tool, event.ok, event.args) == ("projects.list", True, {"team": "물류플랫폼팀"})
    tool_events = [e.data for e in run.events.filter(kind="tool_call")]
    assert [e["tool"] for e in tool_events] == ["projects.list"]


@pytest.mark.slow
@pytest.mark.django_db
def test_a_forced_first_tool_named_as_the_admin_knows_it_is_forced_by_its_alias(dotted_server: McpServer) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "projects_list", "args": {"team": "물류플랫폼팀"}}]},
        {"content": "done"},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, dotted_server, slug="dotted-forced")
        agent.tool_selection = {"force_first_tool": "projects.list"}
        agent.save()
        run = submit(agent, "물류플랫폼팀 프로젝트?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    choice = server.requests[0]["body"].get("tool_choice")
    assert choice == {"type": "function", "function": {"name": "projects_list"}}, choice


@pytest.mark.slow
@pytest.mark.django_db
def test_the_gates_diagnostic_names_the_tool_by_the_alias_the_model_can_call(dotted_server: McpServer) -> None:
    """The gate said "Tool '직원.검색' was not called … call it again": a name the model was never offered, so its
    correction went to a tool that did not exist."""
    ToolContract.objects.filter(tool__server=dotted_server, tool__name="직원.검색").update(
        args={"name": {"type": "str", "required": True, "allowed": ["김하늘", "이서준"]}}
    )
    alias = model_tool_names(["projects.list", "직원.검색"])["직원.검색"]
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": alias, "args": {"name": "홍길동"}}]},
        {"content": "확인 불가"},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, dotted_server, slug="dotted-refused")
        run = submit(agent, "홍길동 소속?")
    (told,) = [m["content"] for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert f"'{alias}'" in told and "직원.검색" not in told, told
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.tool, event.reason) == ("직원.검색", "args:allowed:name")


def test_a_diagnostic_names_each_tool_as_the_model_knows_it_and_leaves_other_text_alone() -> None:
    from mcpregistry.gate import ToolResult

    names = {"projects.list": "projects_list", "search": "crm_search"}
    failed = ToolResult(ok=False, message="Tool 'search' failed. Use the fallback tool 'projects.list'; search again.")
    assert failed.for_model(names) == ("Tool 'crm_search' failed. Use the fallback tool 'projects_list'; search again.")
    backup = ToolResult(ok=True, value="search: 3", tool="projects.list", fallback_for="search")
    assert backup.for_model(names).endswith(
        "'projects_list', because 'crm_search' failed)\n" + tool_data_block("search: 3")
    )
