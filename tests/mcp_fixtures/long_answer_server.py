"""A FastMCP server over a network transport (``sse`` or ``streamable-http``, the first argument; the port, the
second) whose one tool answers as many characters as asked: for the pool's bound on an answer's size."""

from __future__ import annotations

import sys

from mcp.server.fastmcp import FastMCP

transport, port = sys.argv[1], int(sys.argv[2])
server = FastMCP("long-answers", host="127.0.0.1", port=port)


@server.tool()
def answer(n: int) -> str:
    """Answers ``n`` characters."""
    return "가" * n


if __name__ == "__main__":
    server.run(transport=transport)  # type: ignore[arg-type]
