"""graph-parallel: fan out, then join. The employee's record and their assets are fetched side by side."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import FlowState, as_data, default_mcp_id, failed, name_in, unavailable
from agents.tools import MCPHandle

mcp = MCPHandle()


async def employee(state: FlowState) -> dict[str, Any]:
    return {"employee": as_data(await mcp.call("search_employee", params={"name": name_in(state["query"]) or ""}))}


async def assets(state: FlowState) -> dict[str, Any]:
    return {"assets": as_data(await mcp.call("get_asset", params={"owner": name_in(state["query"]) or ""}))}


async def join(state: FlowState) -> dict[str, Any]:
    person, owned = state.get("employee"), state.get("assets")
    if failed(person):
        return {"output": unavailable("직원 정보를")}
    if not isinstance(person, dict):
        # The server's own answer where nobody has that name (it names the registered ones).
        return {"output": f"직원 정보를 찾지 못했습니다: {person}"}
    if failed(owned):
        owned_text = unavailable("자산 정보를")
    elif isinstance(owned, dict):
        items = ", ".join(f"{a['type']}({a['asset_id']})" for a in owned.get("assets", []))
        owned_text = f"자산 {owned.get('count', 0)}건: {items}"
    else:
        owned_text = str(owned)  # the server's text: no assets
    return {"output": f"{person['name']} 님 ({person['team']}, {person['role']}) — {owned_text}"}


async def build_graph(settings: Any) -> CompiledStateGraph:
    mcp_id = settings.option("mcp_id") or default_mcp_id()
    await mcp.bind_registry(settings, mcp_ids=[mcp_id], mcp_id=mcp_id)
    graph = StateGraph(FlowState)
    graph.add_node("employee", employee)
    graph.add_node("assets", assets)
    graph.add_node("join", join)
    graph.add_edge(START, "employee")
    graph.add_edge(START, "assets")
    graph.add_edge(["employee", "assets"], "join")
    graph.add_edge("join", END)
    return graph.compile()
