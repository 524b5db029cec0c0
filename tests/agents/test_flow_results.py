"""A flow tells a failed call from a tool's answer: ``MCPHandle.call`` returns a failure as a ``ToolFailure`` (a
dict with ok/error/message, as the seed's flows read it), so a tool whose answer is itself ``{"ok": false}`` is
an answer. Real probe server over stdio, real flow run."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.conf import settings as django_settings
from langgraph.graph import END, START, StateGraph

from agents.execution import run_execute
from agents.flows.common import FlowState, failed
from agents.models import Agent, Run
from agents.tools import MCPHandle, ToolFailure
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

mcp = MCPHandle()


async def judge(state: FlowState) -> dict[str, Any]:
    answer = await mcp.call("echo", params={"text": '{"ok": false, "note": "재고 없음"}'})
    refused = await mcp.call("echo", params={"text": 7})
    first = await mcp.call("flaky", params={"key": "k"})  # its contract names a fallback: the flow decides
    return {
        "output": f"answer: {'failed' if failed(answer) else answer['note']}; "
        f"refused: {refused['error'] if failed(refused) else 'answered'}; "
        f"flaky: {first['error'] if failed(first) else first}"
    }


async def build_graph(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=["flow-probe"])
    graph = StateGraph(FlowState)
    graph.add_node("judge", judge)
    graph.add_edge(START, "judge")
    graph.add_edge("judge", END)
    return graph.compile()


def test_failed_reads_the_type_not_the_keys() -> None:
    assert failed(ToolFailure(ok=False, error="tool:error", message="x"))
    assert not failed({"ok": False, "note": "a tool's own answer"})
    assert ToolFailure(ok=False, error="e", message="m") == {"ok": False, "error": "e", "message": "m"}


def test_a_flow_tells_a_tools_ok_false_answer_from_a_failed_call(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [f"{__name__}.build_graph"]
    server = McpServer.objects.create(
        mcp_id="flow-probe",
        name="flow-probe",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(django_settings.BASE_DIR),
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="flaky").update(
        fallback_tool="count_calls", risk="read", retry={"max_attempts": 1}
    )
    agent = make_agent(slug="flow-probe", servers=[server], with_demo_rules=False)  # offline
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=f"{__name__}.build_graph")
    run = Run.objects.create(agent=agent, query="재고?")
    try:
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close("flow-probe")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert run.answer == "answer: 재고 없음; refused: args:type:text; flaky: tool:error"
