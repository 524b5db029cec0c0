"""A FastMCP server (stdio) whose tools answer typed values as FastMCP sends them: a value that is no object
(``-> int``, ``-> float``, ``-> bool``, ``-> str``) as its text (``3``, ``0.5``, ``true``) beside the structured
content ``{"result": <value>}``, whose output schema says ``x-fastmcp-wrap-result``.

- ``count``, ``ratio``, ``flag``: an int, a float, a bool; ``code``: the text ``"3"`` (a ``str`` tool);
- ``text_count``, ``text_count_with_unit``: ``3`` and ``4개`` as text only (no output schema, no structured
  content: as a server that answers text only);
- ``mixed_count``: the text ``4개`` beside the structured content ``{"result": 4}`` (the two disagree);
- ``result_object``: an object whose one key is ``result`` (``{"result": 3}``, sent as that object's JSON text);
- ``stock``: seed 004's stock lookup, its keys decomposed (NFD: Korean as macOS writes it), ``재고`` -3;
- ``echo``: the ``region`` it was sent, exactly (to see what reached the tool).

With ``TYPED_RESULTS_RAW=1`` it is instead a hand-written server (no SDK, which sends NaN as null) whose tools
``nan_days`` and ``inf_days`` answer only a structured content whose ``days`` is NaN or Infinity (as Python's
``json.dumps`` writes them, and as the MCP SDK's client parses them)."""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from typing import Any


def _serve_raw() -> None:
    read_only = {"readOnlyHint": True}
    tools = [
        {
            "name": name,
            "description": "d",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": read_only,
        }
        for name in ("nan_days", "inf_days")
    ]

    def answer(message_id: object, result: object) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize":
            server_info = {"name": "typed-raw", "version": "1"}
            protocol = params["protocolVersion"]
            answer(
                message["id"], {"protocolVersion": protocol, "capabilities": {"tools": {}}, "serverInfo": server_info}
            )
        elif method == "tools/list":
            answer(message["id"], {"tools": tools})
        elif method == "tools/call":
            days = float("nan") if params.get("name") == "nan_days" else float("inf")
            answer(message["id"], {"content": [], "structuredContent": {"days": days, "팀": "물류"}})
        else:
            answer(message["id"], {})


def _serve_fastmcp() -> None:
    from fastmcp import FastMCP
    from fastmcp.tools.tool import ToolResult
    from mcp.types import TextContent

    mcp = FastMCP("typed-results")
    read_only = {"readOnlyHint": True}

    @mcp.tool(annotations=read_only)
    def count() -> int:
        """How many items there are."""
        return 3

    @mcp.tool(annotations=read_only)
    def ratio() -> float:
        """A share of the items."""
        return 0.5

    @mcp.tool(annotations=read_only)
    def flag() -> bool:
        """Whether any item is there."""
        return True

    @mcp.tool(annotations=read_only)
    def code() -> str:
        """A code that reads like a number."""
        return "3"

    @mcp.tool(annotations=read_only, output_schema=None)
    def text_count() -> str:
        """A count as text only."""
        return "3"

    @mcp.tool(annotations=read_only, output_schema=None)
    def text_count_with_unit() -> str:
        """A count with its unit, as text only (seed 004's "4개")."""
        return "4개"

    @mcp.tool(annotations=read_only)
    def mixed_count() -> int:
        """A count whose text and structured content disagree."""
        return ToolResult(  # type: ignore[return-value]
            content=[TextContent(type="text", text="4개")], structured_content={"result": 4}
        )

    @mcp.tool(annotations=read_only)
    def result_object() -> dict[str, Any]:
        """An object whose one key is 'result'."""
        return {"result": 3}

    @mcp.tool(annotations=read_only)
    def stock(region: str) -> dict[str, Any]:
        """Seed 004's stock lookup, its keys decomposed."""
        return {unicodedata.normalize("NFD", "지역"): region, unicodedata.normalize("NFD", "재고"): -3}

    @mcp.tool(annotations=read_only)
    def echo(region: str) -> str:
        """The region it was sent, as it came."""
        return json.dumps([ord(c) for c in region])

    mcp.run(show_banner=False)


if __name__ == "__main__":
    if os.environ.get("TYPED_RESULTS_RAW") == "1":
        _serve_raw()
    else:
        _serve_fastmcp()
