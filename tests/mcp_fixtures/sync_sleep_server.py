"""A FastMCP server (the ``fastmcp`` package, as the demo server and many third-party servers are written) with a
tool that sleeps in a thread and then fails, as a stalled backend: once a client gives up on it and cancels, the
thread runs on, and its late answer to the cancelled request breaks the server (its session's task group ends,
the process exits: modelcontextprotocol/python-sdk#2416). A call made on that session meanwhile is lost."""

from __future__ import annotations

import time

from fastmcp import FastMCP

mcp = FastMCP("sync-sleep")


@mcp.tool()
def stalled_backend(seconds: float) -> str:
    """Wait ``seconds`` in the SDK's worker thread for a backend that then times out."""
    time.sleep(seconds)
    raise TimeoutError(f"the backend gave no answer within {seconds:g} s")


@mcp.tool()
def echo(text: str) -> str:
    """Answer ``text`` at once."""
    return text


if __name__ == "__main__":
    mcp.run("stdio", show_banner=False)
