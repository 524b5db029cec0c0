"""Code rules for ``tests/agents/test_deterministic_defects.py`` (registered by dotted path)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from agents.tools import DeterministicContext, deterministic_tool


@deterministic_tool(mcp_id="sds-company-data")
def route_with_a_date(ctx: DeterministicContext) -> dict | None:
    if "프로젝트" in ctx.query:
        return {"tool_name": "list_projects", "params": {"team": "물류플랫폼팀", "since": datetime.date(2026, 1, 1)}}
    return None


@deterministic_tool(mcp_id="sds-company-data")
def route_with_a_number_as_a_name(ctx: DeterministicContext) -> dict | None:
    return {"tool_name": "list_projects", "params": {"team": "물류플랫폼팀", 1: "x"}}


@deterministic_tool(mcp_id="sds-company-data")
def route_with_a_set(ctx: DeterministicContext) -> dict | None:
    return {"tool_name": "list_projects", "params": {"team": {"물류플랫폼팀"}}}


@deterministic_tool(mcp_id="sds-company-data")
def route_with_nan(ctx: DeterministicContext) -> dict | None:
    return {"tool_name": "list_projects", "params": {"team": "물류플랫폼팀", "limit": float("nan")}}


@deterministic_tool(mcp_id="sds-company-data")
def route_reading_its_tool(ctx: DeterministicContext) -> dict | None:
    """Looks the employee up with its own tool, then routes on the team found (seed 000 example 3's pattern)."""
    tool = next(t for t in ctx.mcp_tools if t.name == "search_employee")
    employee = json.loads(tool.invoke({"name": "김하늘"}))
    return {"tool_name": "list_projects", "params": {"team": employee["team"]}}


@deterministic_tool(mcp_id="sds-company-data")
def route_that_raises_without_calling(ctx: DeterministicContext) -> dict | None:
    raise KeyError("team")


@deterministic_tool(mcp_id="sds-company-data")
def route_if_the_lookup_says(ctx: DeterministicContext) -> dict | None:
    """Looks the employee up and routes only where the answer names the team: None on the dry run's stand-in."""
    tool = next(t for t in ctx.mcp_tools if t.name == "search_employee")
    if "클라우드운영팀" in str(tool.invoke({"name": "김하늘"})):
        return {"tool_name": "list_projects", "params": {"team": "클라우드운영팀"}}
    return None


@deterministic_tool(mcp_id="sds-company-data")
def route_by_the_team_found(ctx: DeterministicContext) -> dict | None:
    """Looks the employee up and routes with a team taken from the answer (another on the dry run's stand-in)."""
    tool = next(t for t in ctx.mcp_tools if t.name == "search_employee")
    team = "클라우드운영팀" if "클라우드운영팀" in str(tool.invoke({"name": "김하늘"})) else "물류플랫폼팀"
    return {"tool_name": "list_projects", "params": {"team": team}}


@deterministic_tool(mcp_id="order-service")
def route_that_exits(ctx: DeterministicContext) -> dict | None:
    sys.exit(2)


@deterministic_tool(mcp_id="order-service")
def route_that_parses_its_query(ctx: DeterministicContext) -> dict | None:
    """argparse on input it refuses calls ``sys.exit(2)``."""
    parser = argparse.ArgumentParser(prog="orders")
    parser.add_argument("--order", required=True)
    parser.parse_args(ctx.query.split())
    return None


@deterministic_tool(mcp_id="order-service")
def route_with_params_nested_too_deep(ctx: DeterministicContext) -> dict | None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    return {"tool_name": "get_order", "params": {"orderId": deep}}
