"""graph-conditional: the question decides the branch (the Flow counterpart of a deterministic rule)."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import (
    FlowState,
    as_data,
    default_mcp_id,
    failed,
    name_in,
    project_names,
    team_in,
    unavailable,
)
from agents.tools import MCPHandle

mcp = MCPHandle()


def route(state: FlowState) -> str:
    query = state["query"]
    if any(word in query for word in ("자산", "노트북", "모니터")):
        return "assets"
    if "프로젝트" in query:
        return "projects"
    if any(word in query for word in ("인원", "명단", "몇 명")):
        return "members"
    return "employee"


# A failed call (``failed``) is answered in a sentence of its own (``unavailable``); the server's text answer
# (nobody of that name, no such team) is the answer as it is.


async def assets(state: FlowState) -> dict[str, Any]:
    owner = name_in(state["query"]) or ""
    found = as_data(await mcp.call("get_asset", params={"owner": owner}))
    if failed(found):
        return {"output": unavailable(f"{owner or '전체'} 자산 정보를")}
    if isinstance(found, dict) and "count" in found:
        return {"output": f"{owner or '전체'} 자산 {found['count']}건"}
    return {"output": str(found)}


async def projects(state: FlowState) -> dict[str, Any]:
    team = team_in(state["query"]) or ""
    found = await mcp.call("list_projects", params={"team": team})
    if failed(found):
        return {"output": unavailable(f"{team or '전체'} 프로젝트 목록을")}
    return {"output": f"{team or '전체'} 프로젝트: {project_names(found)}"}


async def members(state: FlowState) -> dict[str, Any]:
    team = team_in(state["query"]) or ""
    found = as_data(await mcp.call("list_team_members", params={"team": team}))
    if failed(found):
        return {"output": unavailable(f"{team} 인원 정보를" if team else "인원 정보를")}
    if isinstance(found, dict) and "count" in found:
        return {"output": f"{team} 인원은 {found['count']}명입니다."}
    return {"output": str(found)}


async def employee(state: FlowState) -> dict[str, Any]:
    found = as_data(await mcp.call("search_employee", params={"name": name_in(state["query"]) or ""}))
    if failed(found):
        return {"output": unavailable("직원 정보를")}
    if isinstance(found, dict) and "team" in found:
        return {"output": f"{found['name']} 님은 {found['team']} 소속입니다."}
    return {"output": str(found)}


async def build_graph(settings: Any) -> CompiledStateGraph:
    mcp_id = settings.option("mcp_id") or default_mcp_id()
    await mcp.bind_registry(settings, mcp_ids=[mcp_id], mcp_id=mcp_id)
    graph = StateGraph(FlowState)
    for name, node in (("assets", assets), ("projects", projects), ("members", members), ("employee", employee)):
        graph.add_node(name, node)
        graph.add_edge(name, END)
    graph.add_conditional_edges(START, route, ["assets", "projects", "members", "employee"])
    return graph.compile()
