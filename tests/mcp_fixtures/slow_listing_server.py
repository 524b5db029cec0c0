"""A hand-written stdio MCP server (no SDK on the server side) whose ``tools/call`` answers at once and whose
``tools/list`` takes ``LIST_DELAY`` seconds (or as many as the file ``LIST_DELAY_FILE`` says when it lists). ``report`` declares an output schema (``{"done": <boolean>}``) and
answers ``{"done": true}``, or ``{"done": "no"}`` (which breaks it) where its argument ``bad`` is true; any other
tool name is answered too (it is listed nowhere). With ``PAGED=1`` the list comes in two pages, ``report`` on the
second. Each request's method is appended to the file ``LOG`` as it comes, and ``answered tools/list`` once a list
was answered."""

from __future__ import annotations

import json
import os
import sys
import time

LOG = os.environ["LOG"]
LIST_DELAY = float(os.environ.get("LIST_DELAY", "0"))
PAGED = os.environ.get("PAGED") == "1"


def tool(name: str, output_schema: dict[str, object] | None = None) -> dict[str, object]:
    listed: dict[str, object] = {"name": name, "inputSchema": {"type": "object", "properties": {"bad": {}}}}
    return {**listed, "outputSchema": output_schema} if output_schema else listed


REPORT = tool("report", {"type": "object", "properties": {"done": {"type": "boolean"}}, "required": ["done"]})


def list_delay() -> float:
    delay_file = os.environ.get("LIST_DELAY_FILE")
    if delay_file and os.path.exists(delay_file):
        with open(delay_file, encoding="utf-8") as f:
            return float(f.read())
    return LIST_DELAY


def log(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def answer(message_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}) + "\n")
    sys.stdout.flush()


def tools_page(cursor: str | None) -> dict[str, object]:
    if not PAGED:
        return {"tools": [REPORT]}
    if cursor is None:
        return {"tools": [tool("other")], "nextCursor": "2"}
    return {"tools": [REPORT]}


for line in sys.stdin:
    message = json.loads(line)
    method, params = message.get("method"), message.get("params") or {}
    log(str(method))
    if "id" not in message:
        continue
    if method == "initialize":
        answer(
            message["id"],
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "slow-listing", "version": "1"},
            },
        )
    elif method == "tools/list":
        time.sleep(list_delay())
        answer(message["id"], tools_page(params.get("cursor")))
        log("answered tools/list")
    elif method == "tools/call":
        done = "no" if (params.get("arguments") or {}).get("bad") else True
        answer(
            message["id"],
            {"content": [{"type": "text", "text": json.dumps({"done": done})}], "structuredContent": {"done": done}},
        )
    else:
        answer(message["id"], {})
