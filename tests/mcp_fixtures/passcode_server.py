"""A stdio MCP server with one write tool whose integer argument is named like a secret (``passcode``): masked,
a stored conversation holds ``"***"`` in its place. Each call appends ``<door>\\t<passcode>`` to ``NOTES_FILE``."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("passcode")


@mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
def unlock_door(door: str, passcode: int) -> str:
    """Unlocks ``door`` with its numeric passcode."""
    with open(os.environ["NOTES_FILE"], "a", encoding="utf-8") as f:
        f.write(f"{door}\t{passcode}\n")
    return f"unlocked {door}"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
