"""A streamable-HTTP MCP server that tells what HTTP headers reached it: ``python -m
tests.mcp_fixtures.headers_server PORT [FILE]``. With a FILE, its write tool ``record`` appends a line to it
(the file counts what the server really did)."""

from __future__ import annotations

import json
import sys

from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_headers

mcp = FastMCP("headers")


@mcp.tool(annotations={"readOnlyHint": True})
def request_headers() -> str:
    """The headers of this request, as JSON."""
    return json.dumps(get_http_headers(include_all=True))


@mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
def record(text: str) -> str:
    """Appends ``text`` to the server's file."""
    with open(sys.argv[2], "a", encoding="utf-8") as f:
        f.write(text + "\n")
    return "recorded"


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
