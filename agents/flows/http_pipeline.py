"""graph-http-pipeline: an HTTP-style request in, an HTTP-style response out, with a tool call in between.

The request comes as an A2A data part ``{"request": {"method": "GET", "path": "/employees/김하늘"}}`` or as the
query itself (``GET /teams/클라우드운영팀/members``). Routes: ``/employees/{name}``, ``/teams/{team}/members``,
``/teams/{team}/projects``, ``/assets?owner={name}``. The output is ``{"status": ..., "body": ...}``: 200 with
the data, 400 for a path that cannot be read or that names no one (``/assets`` without an owner: no tool is
called), 404 where there is none (the server's text as ``error``), 405 for a method but GET, 502 where the call
failed (its reason code as ``error``: a read tool's own error raised is ``tool:error``, returned as a value
``tool:error_value``, each with the tool's own words in ``message``) or the tool answered its own error beside its
data, which the gate hands over as an answer (``tool:error``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agent_platform.text import nfc
from agents.deterministic import width_folded
from agents.flows.common import (
    FlowState,
    as_data,
    ask_for_a_name,
    default_mcp_id,
    failed,
    unanswered,
    unavailable,
)
from agents.tools import MCPHandle

mcp = MCPHandle()

ROUTES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"^/employees/(?P<value>[^/]+)$"), "search_employee", "name"),
    (re.compile(r"^/teams/(?P<value>[^/]+)/members$"), "list_team_members", "team"),
    (re.compile(r"^/teams/(?P<value>[^/]+)/projects$"), "list_projects", "team"),
]
# What a request that names no one is told to send instead.
EXAMPLES = {
    "get_asset": "GET /assets?owner=김하늘",
    "search_employee": "GET /employees/김하늘",
    "list_team_members": "GET /teams/클라우드운영팀/members",
    "list_projects": "GET /teams/클라우드운영팀/projects",
}


async def parse_request(state: FlowState) -> dict[str, Any]:
    for part in state.get("a2a_data") or []:
        if isinstance(part, dict) and isinstance(part.get("request"), dict):
            return {"request": part["request"]}
    # Any whitespace between the method and the path: a tab, the ideographic space of a Korean input method.
    method, path = [*state["query"].split(None, 1), "", ""][:2]
    return {"request": {"method": method.upper(), "path": path.strip()}}


async def dispatch(state: FlowState) -> dict[str, Any]:
    request = state["request"]
    # The method as a Korean input method's full-width mode types it too ("ＧＥＴ"); none given is a GET, as a
    # request line without one would be read by no server, but a data part that names only its path means one.
    if width_folded(str(request.get("method") or "GET")).strip().upper() != "GET":
        return {"response": {"status": 405, "body": {"error": "only GET is supported"}}}
    if not isinstance(request.get("path", ""), str):  # a number, a list, null: no path ("no route for None")
        return {"response": {"status": 400, "body": {"error": "malformed path"}}}
    try:
        # The path as the method: "／employees／김하늘" typed in full-width mode is "/employees/김하늘".
        url = urlsplit(width_folded(request.get("path", "")))
        query = parse_qs(url.query)
    except ValueError:  # "//[oops": a netloc that is no host (urlsplit refuses it)
        return {"response": {"status": 400, "body": {"error": "malformed path"}}}
    # Composed as the data is (``nfc``): a name percent-encoded as macOS types it is decomposed (NFD) once decoded.
    path = nfc(unquote(url.path))
    if path == "/assets":
        tool, arg, value = "get_asset", "owner", nfc((query.get("owner") or [""])[0]).strip()
    else:
        match = next(((tool, arg, m) for pattern, tool, arg in ROUTES if (m := pattern.match(path))), None)
        if match is None:
            return {"response": {"status": 404, "body": {"error": f"no route for {path}"}}}
        tool, arg, found = match
        value = found.group("value").strip()
    if not value:
        # No one named ("/assets", "?owner=", "/employees/%20"): the tool is not called with an empty filter (the
        # demo server's get_asset answers every owner's assets for it); the caller is asked for one, as every
        # template asks.
        body = {"error": f"{arg} is required", "message": ask_for_a_name(EXAMPLES[tool])}
        return {"response": {"status": 400, "body": body}}
    params = {arg: value}
    result = as_data(await mcp.call(tool, params=params))
    if unanswered(result):
        # The failure's reason code, not its message (the gate's guidance for a model; the run page shows it).
        code = result.get("error") if failed(result) else "tool:error"
        message = unavailable("요청한 정보를", result)
        return {"response": {"status": 502, "body": {"error": code, "message": message}}}
    if isinstance(result, str):
        # The demo server answers its data as JSON and "nothing found" as text (no such employee or team, no
        # assets or projects for it): every route's nothing is a 404.
        return {"response": {"status": 404, "body": {"error": result}}}
    return {"response": {"status": 200, "body": result}}


async def render_response(state: FlowState) -> dict[str, Any]:
    return {"output": state["response"]}


async def build_graph(settings: Any) -> CompiledStateGraph:
    mcp_id = settings.option("mcp_id") or default_mcp_id()
    await mcp.bind_registry(settings, mcp_ids=[mcp_id], mcp_id=mcp_id)
    graph = StateGraph(FlowState)
    graph.add_node("parse_request", parse_request)
    graph.add_node("dispatch", dispatch)
    graph.add_node("render_response", render_response)
    graph.add_edge(START, "parse_request")
    graph.add_edge("parse_request", "dispatch")
    graph.add_edge("dispatch", "render_response")
    graph.add_edge("render_response", END)
    return graph.compile()
