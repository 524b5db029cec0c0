"""A small MCP server (stdio) for tests that need to see what a server process receives, or how the platform
copes with a misbehaving one. ``PROBE_MODE`` picks the misbehaviour:

- ``ok`` (default): behaves.
- ``garbage``: writes non-protocol text to stdout before serving.
- ``hang_init``: never answers ``initialize``.
- ``exit_on_call``: the process exits in the middle of a ``tools/call``.
- ``slow``: ``sleep`` tools really sleep (for timeouts).
- ``exit_on_list``: the process exits in the middle of ``tools/list`` (discovery sees the crash).
- ``garbage_only``: speaks no MCP at all: every line it reads is answered with non-protocol text (a command
  that is not an MCP server), until its stdin closes.
- ``garbage_exit``: prints a usage text to stdout and exits with status 2 (a command that is not an MCP server
  and says so the way command-line tools do).
- ``tells_secret``: careless with its ``PROBE_TOKEN``: writes it to its stderr at start, and lists one more tool,
  ``connect_backend``, whose description quotes it and whose input schema has an ``api_key`` property.
- ``refuses_token``: refuses its ``PROBE_TOKEN`` at start, quoting it on its stderr, and exits 1 (as many command
  line tools do).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

mode = os.environ.get("PROBE_MODE", "ok")

# The modes that never serve MCP act before FastMCP is imported (the import is most of a start's time: a second
# on a busy machine), exactly as they did after it.
if mode == "refuses_token":
    print(f"Invalid API key {os.environ.get('PROBE_TOKEN', '')} (401 from upstream)", file=sys.stderr, flush=True)
    sys.exit(1)

if __name__ == "__main__":
    if mode == "hang_init":
        time.sleep(3600)
    if mode == "garbage_exit":
        sys.stdout.write("usage: probe [--port PORT] [--verbose]\nprobe: error: unrecognized input\n")
        sys.stdout.flush()
        sys.exit(2)
    if mode == "garbage_only":
        for line in sys.stdin:
            sys.stdout.write(f"unknown command: {line.strip()[:40]}\n")
            sys.stdout.flush()
        sys.exit(0)

from fastmcp import Context, FastMCP  # noqa: E402
from fastmcp.exceptions import ToolError  # noqa: E402
from fastmcp.server.middleware import Middleware  # noqa: E402
from fastmcp.utilities.types import Image  # noqa: E402


class _ExitOnList(Middleware):
    async def on_list_tools(self, context, call_next):  # type: ignore[no-untyped-def]
        os._exit(18)


mcp = FastMCP("probe", middleware=[_ExitOnList()] if mode == "exit_on_list" else [])

if mode == "tells_secret":
    _token = os.environ.get("PROBE_TOKEN", "")
    print(f"starting the probe with token {_token}", file=sys.stderr, flush=True)

    @mcp.tool(
        annotations={"readOnlyHint": True}, description=f"Connects to the backend (credentials in use: {_token})."
    )
    def connect_backend(api_key: str) -> str:
        return "connected"


@mcp.tool(annotations={"readOnlyHint": True}, output_schema=None)
def picture():  # type: ignore[no-untyped-def]
    """A result made of an image and an embedded text resource, no text block."""
    from mcp.types import EmbeddedResource, TextResourceContents

    note = TextResourceContents(uri="memo://probe/1", mimeType="text/plain", text="사진 설명: 회의실 A")
    return [
        Image(data=b"\x89PNG\r\n\x1a\n" + b"0" * 300, format="png"),
        EmbeddedResource(type="resource", resource=note),
    ]


@mcp.tool(annotations={"readOnlyHint": True}, output_schema=None)
def picture_with_data():  # type: ignore[no-untyped-def]
    """A JSON text block beside an image."""
    return [
        json.dumps({"id": 7, "room": "회의실 A"}, ensure_ascii=False),
        Image(data=b"\x89PNG" + b"0" * 8, format="png"),
    ]


@mcp.tool(annotations={"readOnlyHint": True})
def environment_names() -> str:
    """The names (not values) of this process's environment variables, comma-separated."""
    return ",".join(sorted(os.environ))


@mcp.tool(annotations={"readOnlyHint": True})
def echo(text: str) -> str:
    """Returns its argument."""
    if mode == "exit_on_call":
        os._exit(17)
    return text


@mcp.tool(annotations={"readOnlyHint": True})
def big_text(chars: int) -> str:
    """Returns ``chars`` characters (for the result size cap)."""
    return "가" * chars


@mcp.tool(annotations={"readOnlyHint": True})
def sleep(seconds: float) -> str:
    """Sleeps, then answers."""
    time.sleep(seconds)
    return f"slept {seconds}"


@mcp.tool(annotations={"readOnlyHint": True})
def request_meta(ctx: Context) -> str:
    """The ``_meta`` of the request that called this tool, as JSON (what a client sent along: e.g. its
    ``traceparent``)."""
    meta = ctx.request_context.meta if ctx.request_context is not None else None
    return json.dumps(meta.model_dump(mode="json", exclude_none=True) if meta is not None else {})


@mcp.resource("meta://{name}")
def request_meta_resource(name: str, ctx: Context) -> str:
    """The ``_meta`` of the resources/read request, as JSON (the client's trace context)."""
    meta = ctx.request_context.meta if ctx.request_context is not None else None
    return json.dumps(meta.model_dump(mode="json", exclude_none=True) if meta is not None else {})


@mcp.prompt()
def request_meta_prompt(ctx: Context) -> str:
    """The ``_meta`` of the prompts/get request, as JSON."""
    meta = ctx.request_context.meta if ctx.request_context is not None else None
    return json.dumps(meta.model_dump(mode="json", exclude_none=True) if meta is not None else {})


_calls: dict[str, int] = {}


@mcp.tool(annotations={"readOnlyHint": True})
def count_calls(key: str) -> str:
    """How many times this tool body ran for ``key`` in this process (memo tests)."""
    _calls[key] = _calls.get(key, 0) + 1
    return f"{key}:{_calls[key]}"


@mcp.tool(annotations={"readOnlyHint": True})
def flaky(key: str) -> str:
    """Fails the first time it is called for ``key``, answers after that."""
    _calls[f"flaky:{key}"] = _calls.get(f"flaky:{key}", 0) + 1
    if _calls[f"flaky:{key}"] == 1:
        raise ToolError(f"first call for {key} fails")
    return f"{key}:ok:{_calls[f'flaky:{key}']}"


@mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
def append_note(text: str, idempotency_key: str = "") -> str:
    """Appends a line to NOTES_FILE (a write tool: every execution is visible in that file)."""
    path = os.environ["NOTES_FILE"]
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{text}\t{idempotency_key}\n")
    with open(path, encoding="utf-8") as f:
        return f"notes: {sum(1 for _ in f)}"


if __name__ == "__main__":
    if mode == "garbage":
        sys.stdout.write("this is not JSON-RPC\n{broken\n")
        sys.stdout.flush()
    mcp.run(transport="stdio", show_banner=False)
    gc.freeze()  # as the demo server: its client waits for the exit, which the collector's last walk slowed
