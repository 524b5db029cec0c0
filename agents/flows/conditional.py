"""graph-conditional: the question decides the branch (the Flow counterpart of a deterministic rule)."""

from __future__ import annotations

import re
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
    team_in,
    unanswered,
    unavailable,
)
from agents.tools import MCPHandle

mcp = MCPHandle()

MEMBERS = re.compile(r"인원|명단|몇\s*명|누구|누가")


def route(state: FlowState) -> str:
    """The branch: assets, projects, a team's members (its head count or names: "몇명", "몇 명", "누구 있어", where
    the question names a team or no one), else one employee."""
    query = state["query"]
    if any(word in query for word in ("자산", "노트북", "모니터")):
        return "assets"
    if "프로젝트" in query:
        return "projects"
    if MEMBERS.search(query) and (team_in(query) or not name_in(query)):
        return "members"
    return "employee"


# A call that brought nothing (``unanswered``: it failed, or the tool answered its own error) is answered in a
# sentence of its own (``unavailable``); the server's text answer (nobody of that name, no such team) is the
# answer as it is. No tool is called with an empty name or team: the answer asks for one. Assets and projects
# without a name or team are everyone's (the tools' empty filter).


async def assets(state: FlowState) -> dict[str, Any]:
    owner = name_in(state["query"]) or ""
    found = as_data(await mcp.call("get_asset", params={"owner": owner}))
    if unanswered(found):
        return {"output": unavailable(f"{owner or '전체'} 자산 정보를", found)}
    if isinstance(found, dict) and "count" in found:
        return {"output": f"{owner or '전체'} 자산 {found['count']}건"}
    if isinstance(found, str):
        return {"output": found}
    return {"output": f"{owner or '전체'} 자산 정보를 찾지 못했습니다."}


async def projects(state: FlowState) -> dict[str, Any]:
    team = team_in(state["query"]) or ""
    found = await mcp.call("list_projects", params={"team": team})
    if unanswered(found):
        return {"output": unavailable(f"{team or '전체'} 프로젝트 목록을", found)}
    names = project_names(found)
    if names is None:
        text = as_data(found)
        return {"output": text if isinstance(text, str) else f"{team or '전체'} 프로젝트 목록을 찾지 못했습니다."}
    return {"output": f"{team or '전체'} 프로젝트: {names}"}


async def members(state: FlowState) -> dict[str, Any]:
    team = team_in(state["query"])
    if not team:
        return {"output": "팀 이름을 알려 주세요. (예: 클라우드운영팀 몇 명이야?)"}
    found = as_data(await mcp.call("list_team_members", params={"team": team}))
    if unanswered(found):
        return {"output": unavailable(f"{team} 인원 정보를", found)}
    if isinstance(found, dict) and "count" in found:
        return {"output": f"{team} 인원은 {found['count']}명입니다."}
    if isinstance(found, str):
        return {"output": found}
    return {"output": f"{team} 인원 정보를 찾지 못했습니다."}


async def employee(state: FlowState) -> dict[str, Any]:
    name = name_in(state["query"])
    if not name:
        return {"output": ask_for_a_name("김하늘 님은 어느 팀이야?")}
    found = as_data(await mcp.call("search_employee", params={"name": name}))
    if unanswered(found):
        return {"output": unavailable("직원 정보를", found)}
    if isinstance(found, dict) and found.get("name") and found.get("team"):
        return {"output": f"{found['name']} 님은 {found['team']} 소속입니다."}
    if isinstance(found, str):
        return {"output": found}
    return {"output": "직원 정보를 찾지 못했습니다."}


async def build_graph(settings: Any) -> CompiledStateGraph:
    mcp_id = settings.option("mcp_id") or default_mcp_id()
    await mcp.bind_registry(settings, mcp_ids=[mcp_id], mcp_id=mcp_id)
    graph = StateGraph(FlowState)
    for name, node in (("assets", assets), ("projects", projects), ("members", members), ("employee", employee)):
        graph.add_node(name, node)
        graph.add_edge(name, END)
    graph.add_conditional_edges(START, route, ["assets", "projects", "members", "employee"])
    return graph.compile()
