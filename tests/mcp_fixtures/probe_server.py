"""A small MCP server (stdio) for tests that need to see what a server process receives, or how the platform
copes with a misbehaving one. ``PROBE_MODE`` picks the misbehaviour:

- ``ok`` (default): behaves.
- ``garbage``: writes non-protocol text to stdout before serving.
- ``hang_init``: never answers ``initialize``.
- ``exit_on_call``: the process exits in the middle of a ``tools/call``.
- ``slow``: ``sleep`` tools really sleep (for timeouts).
"""

from __future__ import annotations

import os
import sys
import time

from fastmcp import FastMCP

mode = os.environ.get("PROBE_MODE", "ok")
mcp = FastMCP("probe")


@mcp.tool()
def environment_names() -> str:
    """The names (not values) of this process's environment variables, comma-separated."""
    return ",".join(sorted(os.environ))


@mcp.tool()
def echo(text: str) -> str:
    """Returns its argument."""
    if mode == "exit_on_call":
        os._exit(17)
    return text


@mcp.tool()
def sleep(seconds: float) -> str:
    """Sleeps, then answers."""
    time.sleep(seconds)
    return f"slept {seconds}"


if __name__ == "__main__":
    if mode == "garbage":
        sys.stdout.write("this is not JSON-RPC\n{broken\n")
        sys.stdout.flush()
    if mode == "hang_init":
        time.sleep(3600)
    mcp.run(transport="stdio", show_banner=False)
