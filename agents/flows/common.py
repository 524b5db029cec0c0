"""What the flow templates share: the state, and reading names and teams out of a Korean question."""

from __future__ import annotations

import re
from typing import Any, TypedDict

from django.conf import settings as django_settings

from agent_platform.json import loads as json_loads
from agents.tools import ToolFailure

NAME = re.compile(r"([가-힣]{2,4})\s*님")
TEAM = re.compile(r"([가-힣A-Za-z]+팀)")


def default_mcp_id() -> str:
    """The server a flow template calls unless the agent's flow options name one (``{"mcp_id": ...}``):
    ``settings.PLATFORM_FLOW_DEFAULT_MCP_ID``."""
    return str(django_settings.PLATFORM_FLOW_DEFAULT_MCP_ID)


class FlowState(TypedDict, total=False):
    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]]
    messages: list[Any]
    employee: Any
    team: str
    assets: Any
    projects: Any
    members: Any
    request: dict[str, Any]
    response: dict[str, Any]
    output: Any


def name_in(query: str) -> str | None:
    found = NAME.search(query)
    return found.group(1) if found else None


def team_in(query: str) -> str | None:
    found = TEAM.search(query)
    return found.group(1) if found else None


def failed(result: Any) -> bool:
    """Whether ``MCPHandle.call`` failed (a tool's own answer ``{"ok": false}`` is an answer, not a failure)."""
    return isinstance(result, ToolFailure)


def as_data(result: Any) -> Any:
    """Tool results are JSON text on the demo server; the gate parses them. Keep strings as they are."""
    if isinstance(result, str):
        try:
            return json_loads(result)
        except ValueError:
            return result
    return result


def unavailable(what: str) -> str:
    """The end user's answer where a call failed (``failed``): ``what`` (with its particle, "직원 정보를") could
    not be fetched. Never the failure's own message: that is the gate's guidance for a model (how to call again),
    shown on the run page with the call, not to the user."""
    return f"{what} 지금 가져오지 못했습니다. 잠시 후 다시 시도해 주세요."


def project_names(projects: Any) -> str:
    """The projects' names, comma-separated; the tool's text answer as it is (the demo server's "no projects").
    A failed call is told as such (callers check ``failed`` first, to say so in a sentence of their own)."""
    if failed(projects):
        return unavailable("프로젝트 목록을")
    rows = as_data(projects)
    if isinstance(rows, list):
        return ", ".join(str(p.get("name")) for p in rows if isinstance(p, dict))
    return str(rows)
