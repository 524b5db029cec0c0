"""Flow agents, on the real demo server (only the flows' code runs: no model).

- The conditional template answered an asset question with a bare count ("이서준 님 모니터 있어?" → "이서준 자산
  2건": he has no monitor, and it read like a yes), and knew only 자산/노트북/모니터 ("이서준 님 GPU 서버" got the
  employee's team). It lists the assets, those of the kind asked for, and says plainly where there are none.
- A flow whose bound server is disabled failed every run as ``flow:error`` (no reason code, no audit, an empty
  trace): its calls are refused by the gate (``mcp:not_loaded:<id>``, audited), as a server disabled mid-run is.
- A flow call the gate answered from its fallback was not counted in ``tool_failures``.
- A flow run's summary line showed stages a flow never runs ("deterministic 0 ms · answer without a model 0 ms")
  and not its flow's time.
- A flow agent's page invited rules ("Add a rule for this agent in the rule editor") its runs never evaluate."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from langgraph.graph import END, START, StateGraph

from agents.admin_runs import run_summary
from agents.execution import run_execute
from agents.flows.common import FlowState, failed, owned_text
from agents.models import Agent, Run
from agents.tools import MCPHandle
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.agents.test_flow_defects import flow_agent, run
from tests.conftest import bind_demo_server, make_agent, module_flow_graphs

pytestmark = pytest.mark.django_db

NOT_LOADED = "mcp:not_loaded:sds-company-data"
ASK_AN_ADMIN = "다시 시도해도 해결되지 않으니 관리자에게 문의해 주세요."

mcp = MCPHandle()


async def asset_status(state: FlowState) -> dict[str, Any]:
    found = await mcp.call("get_asset_status", params={"asset_id": "A-1001"})
    return {"output": f"failed: {found['error']}" if failed(found) else str(found)}


async def build_asset_status(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=["assets-broken"])
    graph = StateGraph(FlowState)
    graph.add_node("status", asset_status)
    graph.add_edge(START, "status")
    graph.add_edge("status", END)
    return graph.compile()


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


# ---- 1. The conditional template's asset answers -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "이서준 님 모니터 있어?",
            "이서준 님의 모니터 자산은 없습니다. 보유 자산 2건: 노트북(A-1003), GPU 서버(A-1008)",
        ),
        ("김하늘의 노트북", "김하늘 님의 노트북 1건: 노트북(A-1001)"),
        ("이서준 님 GPU 서버", "이서준 님의 GPU 서버 1건: GPU 서버(A-1008)"),
        ("이서준 장비 뭐 있어?", "이서준 님의 자산 2건: 노트북(A-1003), GPU 서버(A-1008)"),
        ("이서준 노트북이랑 모니터", "이서준 님의 노트북 1건: 노트북(A-1003). 모니터 자산은 없습니다."),
    ],
)
def test_the_conditional_template_lists_the_assets_of_the_kind_asked_for(
    demo_server: McpServer, query: str, expected: str
) -> None:
    result = run(flow_agent(demo_server, "flow-assets", "agents.flows.conditional.build_graph"), query)
    assert (result.status, result.answer) == (Run.Status.SUCCEEDED, expected), result.error_message
    made = AuditEvent.objects.filter(run_id=result.id, action="tool.call")
    assert [(e.tool, e.args) for e in made] == [("get_asset", {"owner": query[:3]})]


# ---- 2. A disabled server: the gate refuses each call -------------------------------------------------------------


SERVERS = {
    "count": 2,
    "assets": [{"asset_id": "A-1", "type": "파일 서버"}, {"asset_id": "A-2", "type": "GPU 워크스테이션"}],
}
OWNED = {"count": 2, "assets": [{"asset_id": "A-1003", "type": "노트북"}, {"asset_id": "A-1008", "type": "GPU 서버"}]}


@pytest.mark.parametrize(
    ("owned", "asked", "answer"),
    [
        # "GPU 서버" is one kind: an asset of both words, not a 파일 서버 nor a GPU 워크스테이션.
        (SERVERS, "이서준 GPU 서버 있어?", "이서준 님의 GPU 서버 자산은 없습니다. 보유 자산 2건: 파일 서버(A-1), GPU 워크스테이션(A-2)"),
        # Two kinds side by side are two: the missing monitor is said.
        (OWNED, "이서준 노트북 모니터 있어?", "이서준 님의 노트북 1건: 노트북(A-1003). 모니터 자산은 없습니다."),
        (OWNED, "이서준 GPU 서버", "이서준 님의 GPU 서버 1건: GPU 서버(A-1008)"),
    ],
)  # fmt: skip
def test_an_asset_kind_of_two_words_is_one_kind_and_two_kinds_side_by_side_are_two(
    owned: dict[str, Any], asked: str, answer: str
) -> None:
    assert owned_text("이서준", owned, asked) == answer


@pytest.mark.slow
@pytest.mark.parametrize(
    ("graph", "query", "expected"),
    [
        ("conditional", "김하늘 님 노트북", f"김하늘 자산 정보를 가져오지 못했습니다. {ASK_AN_ADMIN}"),
        (
            "http_pipeline",
            "GET /employees/김하늘",
            json.dumps(
                {
                    "status": 502,
                    "body": {"error": NOT_LOADED, "message": f"요청한 정보를 가져오지 못했습니다. {ASK_AN_ADMIN}"},
                },
                ensure_ascii=False,
            ),
        ),
    ],
)
def test_a_flow_whose_server_is_disabled_is_refused_by_the_gate_audited(
    demo_server: McpServer, graph: str, query: str, expected: str
) -> None:
    agent = flow_agent(demo_server, f"flow-off-{graph.replace('_', '-')}", f"agents.flows.{graph}.build_graph")
    McpServer.objects.filter(pk=demo_server.pk).update(enabled=False)
    result = run(agent, query)
    assert (result.status, result.error_code, result.answer) == (Run.Status.SUCCEEDED, "", expected)
    assert result.tool_failures == 1
    [refused] = AuditEvent.objects.filter(run_id=result.id)
    assert (refused.action, refused.ok, refused.reason) == ("tool.call", False, NOT_LOADED)
    [call] = [e for e in result.messages if e.get("type") == "flow_call"]
    assert (call["ok"], call["error"]) == (False, NOT_LOADED)


@pytest.mark.slow
def test_a_flow_bound_to_a_server_the_agent_does_not_bind_still_fails_to_build(demo_server: McpServer) -> None:
    agent = flow_agent(demo_server, "flow-unbound-s45", "agents.flows.conditional.build_graph")
    Agent.objects.filter(pk=agent.pk).update(model_params={"flow": {"mcp_id": "elsewhere"}})
    result = run(agent, "김하늘 님 노트북")
    assert (result.status, result.error_code) == (Run.Status.FAILED, "flow:error")
    assert not AuditEvent.objects.filter(run_id=result.id).exists()


# ---- 3. A call answered from its fallback counts as failed ----------------------------------------------------------


@pytest.mark.slow
def test_a_flow_call_answered_from_its_fallback_is_counted_in_tool_failures() -> None:
    server = bind_demo_server(mcp_id="assets-broken", failure_mode="bad_schema")
    ToolContract.objects.filter(tool__server=server, tool__name="get_asset_status").update(
        fallback_tool="get_asset_status_backup", fallback_policy=ToolContract.FallbackPolicy.CALL
    )
    agent = make_agent(slug="flow-fallback", servers=[server], with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=f"{__name__}.build_asset_status")
    created = Run.objects.create(agent=agent, query="A-1001 상태")
    try:
        run_execute(run_id=str(created.id))
    finally:
        get_default_pool().close("assets-broken")
    created.refresh_from_db()
    assert created.status == Run.Status.SUCCEEDED, created.error_message
    assert "백업 스냅샷 기준" in created.answer
    assert AuditEvent.objects.filter(run_id=created.id, action="tool.fallback").exists()
    assert created.tool_failures == 1


# ---- 4. A flow run's summary line -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_flow_runs_summary_shows_its_flow_and_its_tool_calls_not_the_stages_it_never_runs(
    demo_server: McpServer,
) -> None:
    result = run(flow_agent(demo_server, "flow-summary", "agents.flows.conditional.build_graph"), "김하늘 님 노트북")
    assert result.status == Run.Status.SUCCEEDED and result.timings["tools_ms"] > 0, result.error_message
    parts = run_summary(result)
    timed = next(p for p in parts if p.startswith("flow "))
    assert timed.startswith("flow ") and " ms (its tool calls " in timed, parts
    assert not any("deterministic" in p or "model" in p or p.startswith("tools ") for p in parts), parts


# ---- 5. A flow agent's page -------------------------------------------------------------------------------------------

FLOW_NOTE = "This agent runs a flow: its runs evaluate no rules"
ADD_RULE = "Add a rule for this agent in the rule editor"


@pytest.mark.slow
def test_a_flow_agents_page_says_its_runs_evaluate_no_rules_instead_of_inviting_one(
    admin_client: Client, demo_server: McpServer
) -> None:
    flow = flow_agent(demo_server, "flow-page", "agents.flows.conditional.build_graph")
    react = make_agent(slug="react-page", servers=[demo_server], with_demo_rules=False)
    page = admin_client.get(f"/admin/agents/agent/{flow.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert FLOW_NOTE in page and ADD_RULE not in page
    assert f"deterministicrule/add/?agent={flow.pk}" not in page
    page = admin_client.get(f"/admin/agents/agent/{react.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert FLOW_NOTE not in page and ADD_RULE in page
