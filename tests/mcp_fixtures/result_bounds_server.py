"""A hand-written stdio MCP server (no SDK on the server side) whose answers test the gate's bounds on a result:

* ``image_rows``: an image block and no text, beside a structured content of ``arguments.rows`` rows (default
  100,000): the structured content is the value, and must be measured against the size cap;
* ``deep``: a structured content nested ``arguments.depth`` levels (default 300), deeper than the MCP SDK's JSON
  parser goes (about 200): the client cannot read the answer, which must fail the call at once, not time out.

Both tools are marked read-only (``readOnlyHint``)."""

from __future__ import annotations

import json
import sys
from typing import Any

PIXEL = "iVBORw0KGgo="  # 8 bytes of a PNG's signature, as base64
READ_ONLY = {"readOnlyHint": True}
TOOLS = [
    {
        "name": "image_rows",
        "description": "A chart, and its rows.",
        "inputSchema": {"type": "object", "properties": {"rows": {"type": "integer"}}},
        "annotations": READ_ONLY,
    },
    {
        "name": "deep",
        "description": "A deeply nested answer.",
        "inputSchema": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        "annotations": READ_ONLY,
    },
]


def answer(message_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "바닥"}
    for _level in range(depth):
        value = {"a": value}
    return value


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    if name == "image_rows":
        rows = [{"id": i, "팀": "물류플랫폼팀"} for i in range(int(arguments.get("rows", 100_000)))]
        return {
            "content": [{"type": "image", "data": PIXEL, "mimeType": "image/png"}],
            "structuredContent": {"rows": rows},
        }
    return {"content": [], "structuredContent": nested(int(arguments.get("depth", 300)))}


for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        answer(
            message["id"],
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "result-bounds", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(message["id"], {"tools": TOOLS})
    elif method == "tools/call":
        answer(message["id"], call(params.get("name", ""), params.get("arguments") or {}))
    else:
        answer(message["id"], {})
