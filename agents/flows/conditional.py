"""graph-conditional: the question decides the branch (the Flow counterpart of a deterministic rule)."""

from __future__ import annotations

import re
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import (
    ASSET_WORDS,
    FlowState,
    as_data,
    ask_for_a_name,
    default_mcp_id,
    glued_person,
    name_in,
    owned_text,
    project_names,
    team_in,
    unanswered,
    unavailable,
    without_teams,
)
from agents.tools import MCPHandle

mcp = MCPHandle()

MEMBERS = re.compile(r"인원|명단|몇\s*명|누구|누가|구성원|멤버|팀원")
# Of the members, who they are ("누구 있어", "명단", "팀원 알려줘"), not how many ("몇 명", "인원"), and who leads.
WHO = re.compile(r"누구|누가|명단|구성원|멤버")
COUNT = re.compile(r"인원|몇\s*명")
LEAD = re.compile(r"팀장\S*\s*(?:누구|누가)|(?:누구|누가)\S*\s*팀장")
# A person's team ("김하늘 팀원 누구야", "김하늘이랑 같은 팀 몇 명이야"), not their title ("김하늘 팀장 누구야").
THEIR_TEAM = re.compile(r"팀(?!장)")


def asks_for_the_lead(rest: str) -> bool:
    """Whether the members' question ``rest`` asks who leads them: "팀장 누구야", or 팀장 with no other word of the
    members ("팀장 알려줘", "팀장은?")."""
    return LEAD.search(rest) is not None or ("팀장" in rest and not MEMBERS.search(rest))


def asked(query: str) -> str:
    """What ``query`` asks, outside the team and the person it names ("모니터링팀 몇 명이야?": " 몇 명이야?")."""
    rest, name = without_teams(query), name_in(query)
    return rest.replace(name, " ") if name else rest


def route(state: FlowState) -> str:
    """The branch: assets (``ASSET_WORDS``: "자산", "장비", a kind of asset, "모니터", "GPU 서버"), projects, a
    team's members (its head count or names: "몇명", "몇 명", "누구 있어", where the question names a team, a
    person's team ("박도윤팀장 팀원 몇 명이야?") or no one), or anything else about a team where the question names
    no one ("클라우드운영팀 팀장 알려줘", "클라우드운영팀 직원"), else one employee. The words are looked for outside the
    team and the person named: "모니터링팀 몇 명이야?" asks for members, "자산관리팀 누구 있어?" too,
    "프로젝트관리팀 인원" as well; "클라우드모니터링팀 프로젝트" asks for projects."""
    query = state["query"]
    team, name, rest = team_in(query), name_in(query), asked(query)
    if ASSET_WORDS.search(rest):
        return "assets"
    if "프로젝트" in rest:
        return "projects"
    if MEMBERS.search(rest) and (team or not name or THEIR_TEAM.search(rest)):
        return "members"
    if team and not name:
        # A team and nobody named ("클라우드운영팀 팀장 알려줘", "클라우드운영팀 직원"): the employee branch could only
        # ask for a person's name, about a question that named whom it asks about.
        return "members"
    return "employee"


# A call that brought nothing (``unanswered``: it failed, or the tool answered its own error) is answered in a
# sentence of its own (``unavailable``); the server's text answer (nobody of that name, no such team) is the
# answer as it is. Assets are a person's (``get_asset`` filters by owner only: "클라우드운영팀 노트북" and a question
# naming nobody ask for a name), listed, those of the kind asked for where the question names one (``owned_text``);
# projects a team's, the one named or the named person's (looked up first, as the sequential template does), or,
# where nobody is named, every team's ("전체 프로젝트 보여줘": the tool's empty filter means every team). A team
# written together with a title that may be a name ("박도윤팀장") is asked for first, then, where there is no such
# team, the person of that name's (``of_team``).


async def assets(state: FlowState) -> dict[str, Any]:
    owner = name_in(state["query"])
    if not owner:
        return {"output": ask_for_a_name("김하늘 님의 자산")}
    found = as_data(await mcp.call("get_asset", params={"owner": owner}))
    if unanswered(found):
        return {"output": unavailable(f"{owner} 자산 정보를", found)}
    if isinstance(found, dict) and "count" in found and isinstance(found.get("assets"), list):
        return {"output": owned_text(owner, found, asked(state["query"]))}
    if isinstance(found, str):
        return {"output": found}
    return {"output": f"{owner} 자산 정보를 찾지 못했습니다."}


async def team_of(name: str) -> tuple[str, str]:
    """The team of the person named and the sentence that says so ("김하늘 님은 클라우드운영팀 소속입니다. "); or
    "" and the answer where it cannot be told (the call brought nothing, nobody has that name)."""
    return team_said(as_data(await mcp.call("search_employee", params={"name": name})))


def team_said(employee: Any) -> tuple[str, str]:
    """``team_of`` of the employee lookup's answer ``employee``."""
    if unanswered(employee):
        return "", unavailable("직원 정보를", employee)
    if isinstance(employee, str):
        return "", employee  # the server's own answer where nobody has that name
    if not isinstance(employee, dict) or not employee.get("name") or not employee.get("team"):
        return "", "직원 정보를 찾지 못했습니다."
    team = str(employee["team"])
    return team, f"{employee['name']} 님은 {team} 소속입니다. "


def no_such_team(found: Any) -> bool:
    """Whether a team's lookup found nothing of it: the server's text ("'백엔드팀' 팀을 찾을 수 없습니다", "팀의
    프로젝트가 없습니다") or an empty answer; a call that brought nothing (``unanswered``) is no answer of that."""
    data = as_data(found)
    if unanswered(found):
        return False
    return isinstance(data, str) or not data or (isinstance(data, dict) and not data.get("count"))


async def of_team(query: str, tool: str, team: str) -> tuple[str, str, Any]:
    """``tool``'s answer for ``team``, with the team it is of and the sentence that says whose it is: where there is
    no such team and the team is a name written together with a title (``glued_person``: "박도윤팀장 팀원 몇
    명이야?"), that person's team's ("박도윤 님은 물류플랫폼팀 소속입니다. "); where nobody has that name either
    ("백엔드팀장 누구야?"), the team's answer; where that person's lookup brought nothing (``unanswered``), its
    failure, which the caller tells as a call that brought nothing (not "no such team": the person may have one)."""
    found = await mcp.call(tool, params={"team": team})
    person = glued_person(query, team)
    if person and no_such_team(found):
        employee = as_data(await mcp.call("search_employee", params={"name": person}))
        if unanswered(employee):
            # The person meant may have a team: the failed lookup is told (by its reason), never "no such team".
            return team, "", employee
        their_team, belongs = team_said(employee)
        if their_team:
            return their_team, belongs, await mcp.call(tool, params={"team": their_team})
    return team, "", found


async def projects(state: FlowState) -> dict[str, Any]:
    team, belongs = team_in(state["query"]), ""
    name = "" if team else name_in(state["query"])
    if name:
        team, belongs = await team_of(name)
        if not team:
            return {"output": belongs}
        found = await mcp.call("list_projects", params={"team": team})
    elif team:
        team, belongs, found = await of_team(state["query"], "list_projects", team)
    else:
        # Nobody named: every team's (the tool's empty filter, "빈 문자열이면 전체": "전체 프로젝트 보여줘").
        found = await mcp.call("list_projects", params={"team": ""})
    label = team or "전체"
    if unanswered(found):
        return {"output": belongs + unavailable(f"{label} 프로젝트 목록을", found)}
    names = project_names(found)
    if names is None:
        text = as_data(found)
        return {"output": belongs + (text if isinstance(text, str) else f"{label} 프로젝트 목록을 찾지 못했습니다.")}
    return {"output": f"{belongs}{label} 프로젝트: {names}"}


async def members(state: FlowState) -> dict[str, Any]:
    """The team named, or the named person's (looked up first, as for projects): its head count where that is
    asked ("몇 명", "인원"), else who is in it, as the demo rule says it ("클라우드운영팀 인원은 3명입니다: 김하늘(팀장),
    …"), with the role each has; "팀장 누구", "팀장 알려줘" name the members whose role is the team's lead
    (``asks_for_the_lead``)."""
    query = state["query"]
    team, belongs = team_in(query), ""
    name = "" if team else name_in(query)
    if name:
        team, belongs = await team_of(name)
        if not team:
            return {"output": belongs}
        found = await mcp.call("list_team_members", params={"team": team})
    elif team:
        team, belongs, found = await of_team(query, "list_team_members", team)
    else:
        return {"output": "팀 이름을 알려 주세요. (예: 클라우드운영팀 몇 명이야?)"}
    found = as_data(found)
    if unanswered(found):
        return {"output": belongs + unavailable(f"{team} 인원 정보를", found)}
    if isinstance(found, dict) and "count" in found:
        return {"output": belongs + members_text(team, found, asked(query))}
    if isinstance(found, str):
        return {"output": belongs + found}
    return {"output": f"{belongs}{team} 인원 정보를 찾지 못했습니다."}


def members_text(team: str, found: dict[str, Any], rest: str) -> str:
    """The answer from ``list_team_members``'s ``{"count", "members"}``: the count alone where only it is asked
    (``COUNT`` and no ``WHO``), else the members by name (and role): an answer that names none says the count."""
    count = f"{team} 인원은 {found['count']}명입니다"
    rows = found.get("members")
    people = [row for row in rows if isinstance(row, dict) and row.get("name")] if isinstance(rows, list) else []
    if not people or (COUNT.search(rest) and not WHO.search(rest)):
        return f"{count}."
    roster = ", ".join(f"{p['name']}({p['role']})" if p.get("role") else str(p["name"]) for p in people)
    if asks_for_the_lead(rest):
        leads = [str(p["name"]) for p in people if "팀장" in str(p.get("role") or "")]
        if leads:
            return f"{team} 팀장은 {', '.join(leads)} 님입니다."
        return f"{team}에는 팀장으로 등록된 사람이 없습니다. {count}: {roster}."
    return f"{count}: {roster}."


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
