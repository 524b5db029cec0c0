"""graph-parallel: fan out, then join. The employee's record and their assets are fetched side by side."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.flows.common import (
    FlowState,
    as_data,
    ask_for_a_name,
    assets_text,
    default_mcp_id,
    name_in,
    unanswered,
    unavailable,
)
from agents.tools import MCPHandle

mcp = MCPHandle()

# A question that names no one ("자산 보여줘") calls neither tool: the join asks for a name.


async def employee(state: FlowState) -> dict[str, Any]:
    name = name_in(state["query"])
    return {"employee": as_data(await mcp.call("search_employee", params={"name": name})) if name else None}


async def assets(state: FlowState) -> dict[str, Any]:
    owner = name_in(state["query"])
    return {"assets": as_data(await mcp.call("get_asset", params={"owner": owner})) if owner else None}


async def join(state: FlowState) -> dict[str, Any]:
    person, owned = state.get("employee"), state.get("assets")
    if person is None:
        return {"output": ask_for_a_name("김하늘 님의 자산")}
    if unanswered(person):
        # The assets were fetched beside it: told with the failure, not dropped (the join waited for both).
        told = unavailable("직원 정보를", person)
        if owned is None or unanswered(owned):
            return {"output": told}
        return {"output": f"{told} {name_in(state['query'])} 님 — {assets_text(owned)}"}
    if not isinstance(person, dict):
        # The server's own answer where nobody has that name (it names the registered ones).
        return {"output": f"직원 정보를 찾지 못했습니다: {person}"}
    if not person.get("name"):
        return {"output": "직원 정보를 찾지 못했습니다."}  # an answer that is no employee's record
    about = ", ".join(str(person[key]) for key in ("team", "role") if person.get(key))
    who = f"{person['name']} 님 ({about})" if about else f"{person['name']} 님"
    return {"output": f"{who} — {assets_text(owned)}"}


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
