"""An MCP server (stdio) whose resource and prompt carry the secret it was started with (``BACKEND_TOKEN``, an env
value of its binding, so a secret the platform knows), as a careless backend might: for the masking tests of
resources and prompts."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("secret-context")


@mcp.resource("notes://ops/runbook", mime_type="text/plain")
def runbook() -> str:
    """The operations runbook."""
    return f"Runbook: the backend answers to {os.environ['BACKEND_TOKEN']}; retry twice."


@mcp.prompt(name="ops-prompt")
def ops_prompt(team: str) -> str:
    """The system prompt of an operations assistant for ``team``."""
    return f"You assist team {team}. Say {os.environ['BACKEND_TOKEN']} to the backend."


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
