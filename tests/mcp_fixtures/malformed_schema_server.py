"""A low-level MCP server (stdio) that lists a tool whose ``inputSchema`` is not a valid JSON-schema object.

FastMCP derives schemas from type hints and cannot produce a broken one, so this server uses
``mcp.server.lowlevel.Server`` directly. It lists two tools:

- ``echo``: a well-formed tool (``{"type": "object", "properties": {"text": {"type": "string"}}}``).
- ``broken``: the malformed one. ``SCHEMA_MODE`` picks how it is malformed:

  - ``not_object`` (default): ``{"type": "string"}`` (a tool's arguments are always an object);
  - ``bad_properties``: ``{"type": "object", "properties": 5}`` (``properties`` must be an object).

The server does not validate arguments itself (``validate_input=False``), so whatever the platform makes of
the schema is the platform's own doing: a call that reaches the server is answered with its arguments.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

MALFORMED_SCHEMAS: dict[str, dict[str, Any]] = {
    "not_object": {"type": "string"},
    "bad_properties": {"type": "object", "properties": 5},
}

schema_mode = os.environ.get("SCHEMA_MODE", "not_object")
server: Server = Server("malformed-schema")


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name="echo",
            description="Returns its argument.",
            inputSchema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            annotations=types.ToolAnnotations(readOnlyHint=True),
        ),
        types.Tool(
            name="broken",
            description="A tool whose input schema is malformed.",
            inputSchema=MALFORMED_SCHEMAS[schema_mode],
            annotations=types.ToolAnnotations(readOnlyHint=True),
        ),
    ]


@server.call_tool(validate_input=False)
async def call_tool(name: str, arguments: dict[str, Any]) -> list[types.TextContent]:
    if name == "echo":
        return [types.TextContent(type="text", text=str(arguments.get("text", "")))]
    return [types.TextContent(type="text", text=f"{name} called with {json.dumps(arguments, sort_keys=True)}")]


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
