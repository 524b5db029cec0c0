"""A low-level MCP server (stdio) that lists tools whose input schemas are legal MCP but awkward for a model.

FastMCP writes every schema as ``{"type": "object", ...}``, so this server uses ``mcp.server.lowlevel.Server``.
It always lists ``lookup`` (a plain schema); ``SCHEMA_CASE`` picks the other tool:

- ``typeless`` (default): ``server_status``, an argument-less tool whose schema is ``{}`` (no root ``type``);
- ``root_union``: ``find``, whose root says "an id or a name" with an ``anyOf`` and gives no ``type``;
- ``bare_union``: ``find``, whose arguments are named only inside a root ``anyOf`` of two objects;
- ``deep``: ``nested``, one argument under ``DEPTH`` (90) nested ``anyOf``s: deeper than Python's recursion lets
  ``jsonschema`` check, and still within what the pool parses.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

READ_ONLY = types.ToolAnnotations(readOnlyHint=True)


def nested_argument(depth: int) -> dict[str, Any]:
    argument: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        argument = {"anyOf": [argument]}
    return argument


def other_tool(case: str) -> types.Tool:
    if case == "root_union":
        schema: dict[str, Any] = {
            "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
            "anyOf": [{"required": ["id"]}, {"required": ["name"]}],
        }
        return types.Tool(name="find", description="Finds by id or by name.", inputSchema=schema, annotations=READ_ONLY)
    if case == "bare_union":
        schema = {
            "anyOf": [
                {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
                {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            ]
        }
        return types.Tool(name="find", description="Finds by id or by name.", inputSchema=schema, annotations=READ_ONLY)
    if case == "deep":
        schema = {"type": "object", "properties": {"x": nested_argument(int(os.environ.get("DEPTH", "90")))}}
        return types.Tool(
            name="nested", description="Takes a deeply nested argument.", inputSchema=schema, annotations=READ_ONLY
        )
    return types.Tool(
        name="server_status", description="Tells whether the backend is up.", inputSchema={}, annotations=READ_ONLY
    )


server: Server = Server("schema-roots")


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    lookup = types.Tool(
        name="lookup",
        description="Looks up an id.",
        inputSchema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        annotations=READ_ONLY,
    )
    return [lookup, other_tool(os.environ.get("SCHEMA_CASE", "typeless"))]


@server.call_tool(validate_input=False)
async def call_tool(name: str, arguments: dict[str, Any]) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=f"{name}: up, {json.dumps(arguments, sort_keys=True)}")]


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
