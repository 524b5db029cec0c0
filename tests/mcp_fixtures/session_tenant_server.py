"""A stdio MCP server whose answers depend on who asks: ``login(user)`` sets its session's user and ``my_orders()``
answers for that user (session state); ``tenant()`` answers the ``TENANT`` of its binding's environment."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("session-tenant")
_session = {"user": ""}


@mcp.tool(annotations={"readOnlyHint": True})
def login(user: str) -> str:
    """Sets this session's user."""
    _session["user"] = user
    return f"logged in as {user}"


@mcp.tool(annotations={"readOnlyHint": True})
def my_orders() -> str:
    """The orders of this session's user."""
    return f"orders of {_session['user']}"


@mcp.tool(annotations={"readOnlyHint": True})
def tenant() -> str:
    """The tenant this binding serves."""
    return f"tenant={os.environ.get('TENANT', '')}"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
