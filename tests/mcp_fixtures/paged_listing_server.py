# mypy: disable-error-code="untyped-decorator,no-untyped-call"
"""A low-level MCP server (stdio) whose resources and prompts come 2 to a page: 5 of each, so 3 pages, each page's
``nextCursor`` the index of the next item. It reads every resource and renders every prompt (in Korean). With
``PAGED_ENDLESS=1`` its resources never end: every page names a next one (the same two resources again)."""

from __future__ import annotations

import os

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.stdio import stdio_server
from pydantic import AnyUrl

PAGE_SIZE = 2
RESOURCES = [f"notes://runbook/{n}" for n in range(1, 6)]
PROMPTS = [f"brief_{n}" for n in range(1, 6)]
ENDLESS = os.environ.get("PAGED_ENDLESS") == "1"

server: Server = Server("paged-listing")


def _page(cursor: str | None, total: int) -> tuple[range, str | None]:
    """The indexes of the page that starts at ``cursor``, and the next page's cursor (None after the last)."""
    start = int(cursor or 0)
    end = min(start + PAGE_SIZE, total)
    return range(start, end), (str(end) if end < total else None)


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [types.Tool(name="ping", description="Answers pong.", inputSchema={"type": "object", "properties": {}})]


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, object]) -> list[types.TextContent]:
    return [types.TextContent(type="text", text="pong")]


@server.list_resources()
async def list_resources(request: types.ListResourcesRequest) -> types.ListResourcesResult:
    cursor = request.params.cursor if request.params else None
    indexes, next_cursor = _page(cursor, len(RESOURCES))
    if ENDLESS:
        indexes, next_cursor = range(PAGE_SIZE), str(int(cursor or 0) + 1)
    return types.ListResourcesResult(
        resources=[
            types.Resource(uri=AnyUrl(RESOURCES[i]), name=f"runbook-{i + 1}", mimeType="text/plain") for i in indexes
        ],
        nextCursor=next_cursor,
    )


@server.read_resource()
async def read_resource(uri: AnyUrl) -> list[ReadResourceContents]:
    return [ReadResourceContents(content=f"운영 절차서 {str(uri).rsplit('/', 1)[-1]}번", mime_type="text/plain")]


@server.list_prompts()
async def list_prompts(request: types.ListPromptsRequest) -> types.ListPromptsResult:
    indexes, next_cursor = _page(request.params.cursor if request.params else None, len(PROMPTS))
    return types.ListPromptsResult(
        prompts=[types.Prompt(name=PROMPTS[i], description=f"브리핑 {i + 1}") for i in indexes],
        nextCursor=next_cursor,
    )


@server.get_prompt()
async def get_prompt(name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
    return types.GetPromptResult(
        messages=[types.PromptMessage(role="user", content=types.TextContent(type="text", text=f"{name} 브리핑"))]
    )


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
