"""graph-conditional: the question decides the branch (the Flow counterpart of a deterministic rule)."""

from __future__ import annotations

import re
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import (
    TEAM,
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
    the question names a team or no one), else one employee. The words are looked for outside the team and the
    person named: "모니터링팀 몇 명이야?" asks for members, "자산관리팀 누구 있어?" too, "프로젝트관리팀 인원" as
    well; "클라우드모니터링팀 프로젝트" asks for projects."""
    query = state["query"]
    team, name = team_in(query), name_in(query)
    rest = TEAM.sub(" ", query)
    if name:
        rest = rest.replace(name, " ")
    if any(word in rest for word in ("자산", "노트북", "모니터")):
        return "assets"
    if "프로젝트" in rest:
        return "projects"
    if MEMBERS.search(rest) and (team or not name):
        return "members"
    return "employee"


# A call that brought nothing (``unanswered``: it failed, or the tool answered its own error) is answered in a
# sentence of its own (``unavailable``); the server's text answer (nobody of that name, no such team) is the
# answer as it is. Assets are a person's (``get_asset`` filters by owner only: "클라우드운영팀 노트북" and a question
# naming nobody ask for a name); projects a team's, the one named or the named person's (looked up first, as the
# sequential template does), or, where nobody is named, every team's ("전체 프로젝트 보여줘": the tool's empty
# filter means every team).


async def assets(state: FlowState) -> dict[str, Any]:
    owner = name_in(state["query"])
    if not owner:
        return {"output": ask_for_a_name("김하늘 님의 자산")}
    found = as_data(await mcp.call("get_asset", params={"owner": owner}))
    if unanswered(found):
        return {"output": unavailable(f"{owner} 자산 정보를", found)}
    if isinstance(found, dict) and "count" in found:
        return {"output": f"{owner} 자산 {found['count']}건"}
    if isinstance(found, str):
        return {"output": found}
    return {"output": f"{owner} 자산 정보를 찾지 못했습니다."}


async def projects(state: FlowState) -> dict[str, Any]:
    team, belongs = team_in(state["query"]), ""
    name = "" if team else name_in(state["query"])
    if name:
        employee = as_data(await mcp.call("search_employee", params={"name": name}))
        if unanswered(employee):
            return {"output": unavailable("직원 정보를", employee)}
        if isinstance(employee, str):
            return {"output": employee}  # the server's own answer where nobody has that name
        if not isinstance(employee, dict) or not employee.get("name") or not employee.get("team"):
            return {"output": "직원 정보를 찾지 못했습니다."}
        team = str(employee["team"])
        belongs = f"{employee['name']} 님은 {team} 소속입니다. "
    # Nobody named: every team's (the tool's empty filter, "빈 문자열이면 전체": "전체 프로젝트 보여줘").
    found = await mcp.call("list_projects", params={"team": team or ""})
    label = team or "전체"
    if unanswered(found):
        return {"output": belongs + unavailable(f"{label} 프로젝트 목록을", found)}
    names = project_names(found)
    if names is None:
        text = as_data(found)
        return {"output": belongs + (text if isinstance(text, str) else f"{label} 프로젝트 목록을 찾지 못했습니다.")}
    return {"output": f"{belongs}{label} 프로젝트: {names}"}


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
