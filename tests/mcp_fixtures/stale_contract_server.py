"""A stdio MCP server whose ``lookup`` renames its argument, as a server changes under a published agent version:
``lookup(name)`` by default, ``lookup(full_name)`` with ``LOOKUP_ARG=full_name``, ``lookup(name, limit=10)`` with
``LOOKUP_ARG=name_limit`` (an optional argument the default drops). ``list_teams`` never changes (a tool a stale
version keeps)."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("stale-contract")

if os.environ.get("LOOKUP_ARG", "name") == "full_name":

    @mcp.tool(description="Finds an employee's team.")
    def lookup(full_name: str) -> str:
        return f"{full_name}: 물류플랫폼팀"

elif os.environ.get("LOOKUP_ARG") == "name_limit":

    @mcp.tool(description="Finds an employee's team.")
    def lookup(name: str, limit: int = 10) -> str:  # type: ignore[misc]
        return f"{name}: 물류플랫폼팀"

else:

    @mcp.tool(description="Finds an employee's team.")
    def lookup(name: str) -> str:  # type: ignore[misc]
        return f"{name}: 물류플랫폼팀"


@mcp.tool(description="Lists the teams.")
def list_teams() -> str:
    return "물류플랫폼팀, 클라우드운영팀"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
