"""A streamable-HTTP MCP server that tells what HTTP headers reached it: ``python -m
tests.mcp_fixtures.headers_server PORT``."""

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


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
