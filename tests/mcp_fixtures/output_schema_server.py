"""A low-level MCP server (stdio) with a tool that declares an ``outputSchema`` and answers whatever structured
content it is asked to: ``report`` returns ``{"count": <the argument count>}`` as its structured content, so a
caller can make it break its own schema (``count`` must be an integer). It returns a ``CallToolResult`` itself, so
the server does not check its output: what is refused, the client refused."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"count": {"type": "integer"}, "팀": {"$ref": "#/$defs/team"}},
    "required": ["count"],
    "$defs": {"team": {"type": "string"}},
}
server: Server = Server("output-schema")


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name="report",
            description="Counts.",
            inputSchema={"type": "object", "properties": {"count": {}}},
            outputSchema=OUTPUT_SCHEMA,
            annotations=types.ToolAnnotations(readOnlyHint=True),
        )
    ]


@server.call_tool(validate_input=False)
async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    content = {"count": arguments.get("count"), "팀": "클라우드운영팀"}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(content, ensure_ascii=False))],
        structuredContent=content,
    )


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
