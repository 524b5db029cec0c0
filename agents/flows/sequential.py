"""graph-sequential: A → B → C. Find the employee, then their team's projects, then answer."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import (
    FlowState,
    as_data,
    ask_for_a_name,
    default_mcp_id,
    name_in,
    project_names,
    unanswered,
    unavailable,
)
from agents.tools import MCPHandle

mcp = MCPHandle()


def name_asked(state: FlowState) -> str:
    """The employee asked about: the name in the question (``name_in``: "김하늘의 프로젝트", "박도윤 프로젝트"),
    else an A2A data part's ``name`` (a message with data only); "" when there is neither ("프로젝트 알려줘")."""
    found = name_in(state["query"])
    if found:
        return found
    for part in state.get("a2a_data") or []:
        name = part.get("name") if isinstance(part, dict) else None
        if isinstance(name, str) and name.strip():
            return name.strip()
    return ""


async def lookup_employee(state: FlowState) -> dict[str, Any]:
    name = name_asked(state)
    if not name:
        return {"employee": None}  # nothing to look up: the answer asks for a name
    return {"employee": as_data(await mcp.call("search_employee", params={"name": name}))}


async def team_projects(state: FlowState) -> dict[str, Any]:
    employee = state.get("employee")
    if not isinstance(employee, dict) or unanswered(employee) or not employee.get("team"):
        return {"projects": None}
    team = str(employee["team"])
    return {"team": team, "projects": await mcp.call("list_projects", params={"team": team})}


async def respond(state: FlowState) -> dict[str, Any]:
    employee = state.get("employee")
    if employee is None:
        return {"output": ask_for_a_name("김하늘 님의 프로젝트")}
    if unanswered(employee):
        return {"output": unavailable("직원 정보를", employee)}
    if not isinstance(employee, dict):
        # The server's own answer where nobody has that name (it names the registered ones).
        return {"output": f"직원 정보를 찾지 못했습니다: {employee}"}
    if not employee.get("name") or "team" not in state:
        return {"output": "직원 정보를 찾지 못했습니다."}  # an answer that is no employee's record
    projects = state.get("projects")
    belongs = f"{employee['name']} 님은 {state['team']} 소속"
    if unanswered(projects):
        return {"output": f"{belongs}입니다. " + unavailable("진행 중인 프로젝트 목록을", projects)}
    names = project_names(projects)
    if names is None:
        # The server's own answer where the team has none, else an answer that names no project.
        found = as_data(projects)
        return {
            "output": f"{belongs}입니다. " + (found if isinstance(found, str) else "프로젝트 목록을 찾지 못했습니다.")
        }
    return {"output": f"{belongs}이며, 진행 중인 프로젝트는 {names}입니다."}


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
