"""graph-sequential: A → B → C. Find the employee, then their team's projects, then answer."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import FlowState, as_data, default_mcp_id, failed, name_in, project_names, unavailable
from agents.tools import MCPHandle

mcp = MCPHandle()


def name_asked(state: FlowState) -> str:
    """The employee asked about: "<이름> 님" in the question, else an A2A data part's ``name`` (a message with
    data only), else the question's first word; "" when there is none of them."""
    found = name_in(state["query"])
    if found:
        return found
    for part in state.get("a2a_data") or []:
        name = part.get("name") if isinstance(part, dict) else None
        if isinstance(name, str) and name.strip():
            return name.strip()
    words = state["query"].split()
    return words[0] if words else ""


async def lookup_employee(state: FlowState) -> dict[str, Any]:
    name = name_asked(state)
    if not name:
        return {"employee": None}  # nothing to look up: the answer asks for a name
    return {"employee": as_data(await mcp.call("search_employee", params={"name": name}))}


async def team_projects(state: FlowState) -> dict[str, Any]:
    employee = state.get("employee")
    if not isinstance(employee, dict) or failed(employee):
        return {"projects": None}
    team = employee["team"]
    return {"team": team, "projects": await mcp.call("list_projects", params={"team": team})}


async def respond(state: FlowState) -> dict[str, Any]:
    employee = state.get("employee")
    if employee is None:
        return {"output": "이름을 알려 주세요. (예: 김하늘 님의 프로젝트)"}
    if failed(employee):
        return {"output": unavailable("직원 정보를")}
    if not isinstance(employee, dict):
        # The server's own answer where nobody has that name (it names the registered ones).
        return {"output": f"직원 정보를 찾지 못했습니다: {employee}"}
    projects = state.get("projects")
    if failed(projects):
        return {
            "output": f"{employee['name']} 님은 {state['team']} 소속입니다. " + unavailable("진행 중인 프로젝트 목록을")
        }
    return {
        "output": f"{employee['name']} 님은 {state['team']} 소속이며, 진행 중인 프로젝트는 "
        f"{project_names(projects)}입니다."
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
