"""graph-sequential: A → B → C. Find the employee, then their team's projects, then answer."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import FlowState, as_data, default_mcp_id, failed, name_in, project_names
from agents.tools import MCPHandle

mcp = MCPHandle()


async def lookup_employee(state: FlowState) -> dict[str, Any]:
    name = name_in(state["query"]) or state["query"].split()[0]
    return {"employee": as_data(await mcp.call("search_employee", params={"name": name}))}


async def team_projects(state: FlowState) -> dict[str, Any]:
    employee = state.get("employee")
    if not isinstance(employee, dict) or failed(employee):
        return {"projects": None}
    team = employee["team"]
    return {"team": team, "projects": await mcp.call("list_projects", params={"team": team})}


async def respond(state: FlowState) -> dict[str, Any]:
    employee = state.get("employee")
    if not isinstance(employee, dict) or failed(employee):
        message = employee.get("message") if isinstance(employee, dict) else employee
        return {"output": f"직원 정보를 찾지 못했습니다: {message}"}
    return {
        "output": f"{employee['name']} 님은 {state['team']} 소속이며, 진행 중인 프로젝트는 "
        f"{project_names(state.get('projects'))}입니다."
    }


async def build_graph(settings: Any) -> CompiledStateGraph:
    mcp_id = settings.option("mcp_id") or default_mcp_id()
    await mcp.bind_registry(settings, mcp_ids=[mcp_id], mcp_id=mcp_id)
    graph = StateGraph(FlowState)
    graph.add_node("lookup_employee", lookup_employee)
    graph.add_node("team_projects", team_projects)
    graph.add_node("respond", respond)
    graph.add_edge(START, "lookup_employee")
    graph.add_edge("lookup_employee", "team_projects")
    graph.add_edge("team_projects", "respond")
    graph.add_edge("respond", END)
    return graph.compile()
