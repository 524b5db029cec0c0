"""A stdio MCP server whose tool list is set by its environment, to test discovery:
``TOOL_DESCRIPTION`` is the description of ``lookup``; ``EXTRA_TOOL=1`` adds ``extra``."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("mutable")


def lookup(key: str, limit: int = 1) -> str:
    return f"{key}:{limit}"


mcp.tool(name="lookup", description=os.environ.get("TOOL_DESCRIPTION", "Looks a key up."))(lookup)

if os.environ.get("EXTRA_TOOL") == "1":

    @mcp.tool()
    def extra() -> str:
        """An extra tool."""
        return "extra"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
