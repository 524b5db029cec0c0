"""An MCP server (stdio) for the parallel-call tests: ``gather`` answers whether ``parties`` calls were in flight
on this server at once, so calls a client sends one after another never meet, and the server itself records how
many it held at once (``peak``), whatever the client's trace says.

Every call counts itself in flight while it waits (up to ``wait_s``) for the others; the answer is
``{"label", "met", "peak"}``: ``met`` when ``parties`` calls were in flight together while it waited (never for a
call made alone), ``peak`` the most calls this server process held at once so far.
"""

from __future__ import annotations

import asyncio

from fastmcp import FastMCP

mcp = FastMCP("gather")
in_flight = 0
peak = 0
meetings = 0  # how many times ``parties`` calls were in flight at once
changed = asyncio.Condition()


@mcp.tool(annotations={"readOnlyHint": True})
async def gather(label: str, parties: int = 2, wait_s: float = 5.0) -> dict[str, object]:
    """Waits up to ``wait_s`` seconds until ``parties`` calls are in flight at once, then answers with its label,
    whether they met, and the most calls in flight at once so far."""
    global in_flight, peak, meetings
    async with changed:
        seen = meetings
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight >= parties:
            meetings += 1
            changed.notify_all()
        try:
            met = await asyncio.wait_for(changed.wait_for(lambda: meetings > seen), timeout=wait_s)
        except TimeoutError:
            met = False
        in_flight -= 1
        return {"label": label, "met": met, "peak": peak}


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
