"""A hand-written stdio MCP server (no SDK on the server side) that writes what is not MCP on stdout: with
``BANNER`` set, that line before anything else, then it exits 1 (a program that is no MCP server); a
``tools/call`` of ``garbage_lines`` writes ``arguments.n`` lines of plain text before its answer."""

from __future__ import annotations

import json
import os
import sys

if os.environ.get("BANNER"):
    sys.stdout.write(os.environ["BANNER"] + "\n")
    sys.stdout.flush()
    sys.exit(1)


def answer(message_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}) + "\n")
    sys.stdout.flush()


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
                "serverInfo": {"name": "noisy", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(message["id"], {"tools": [{"name": "garbage_lines", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call":
        for i in range(int((params.get("arguments") or {}).get("n", 10))):
            sys.stdout.write(f"not json line {i}\n")
        answer(message["id"], {"content": [{"type": "text", "text": "after garbage"}]})
    else:
        answer(message["id"], {})
