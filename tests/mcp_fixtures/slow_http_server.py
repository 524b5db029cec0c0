"""A streamable-HTTP MCP server whose tool ``slow`` answers after ``s`` seconds: ``python -m
tests.mcp_fixtures.slow_http_server PORT``."""

from __future__ import annotations

import asyncio
import sys

from fastmcp import FastMCP

mcp = FastMCP("slow")


@mcp.tool()
async def slow(s: float) -> str:
    """Answers "done" after ``s`` seconds."""
    await asyncio.sleep(s)
    return "done"


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
