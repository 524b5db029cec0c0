"""A stdio MCP server whose tool list is set by its environment, to test discovery:
``TOOL_DESCRIPTION`` is the description of ``lookup``; ``EXTRA_TOOL=1`` adds ``extra``; ``LOOKUP_V2=1`` changes
``lookup``'s arguments to ``item_id`` and ``region`` (its schema changed under the admin)."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("mutable")


def lookup(key: str, limit: int = 1) -> str:
    return f"{key}:{limit}"


if os.environ.get("LOOKUP_V2") == "1":

    def lookup(item_id: str, region: str, limit: int = 1) -> str:  # type: ignore[misc]
        return f"{item_id}@{region}:{limit}"


mcp.tool(name="lookup", description=os.environ.get("TOOL_DESCRIPTION", "Looks a key up."))(lookup)

if os.environ.get("EXTRA_TOOL") == "1":

    @mcp.tool()
    def extra() -> str:
        """An extra tool."""
        return "extra"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
