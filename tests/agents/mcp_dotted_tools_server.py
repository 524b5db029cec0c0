"""A stdio MCP server whose tools have names MCP allows and the model providers refuse (``tests/agents/
test_tool_name_aliases.py``): ``projects.list`` (a dot) and ``직원.검색`` (Korean and a dot). Converse's ToolName
and Chat Completions' function name are ``[a-zA-Z0-9_-]{1,64}``."""

from __future__ import annotations

from fastmcp import FastMCP

mcp = FastMCP("dotted-tools")


@mcp.tool(name="projects.list", description="Lists a team's projects.")
def projects_list(team: str) -> str:
    return f"{team}: 차세대 물류 플랫폼 구축"


@mcp.tool(name="직원.검색", description="Finds an employee by name.")
def employee_search(name: str) -> str:
    return f"{name}: 물류플랫폼팀"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
