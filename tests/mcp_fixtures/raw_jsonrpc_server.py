"""A hand-written stdio MCP server (no SDK on the server side), for what an SDK server would not say: its
``tools/list`` is the JSON in the environment variable ``TOOLS`` (names over 200 characters, NUL characters, a
name listed twice); a ``tools/call`` of ``close_ticket`` is answered with a JSON-RPC error whose message says
"closed"; ``slow`` answers after ``arguments.s`` seconds; anything else answers "ok". With ``STDERR_CHARS`` set it
writes that many characters on one stderr line and exits 1 before reading anything."""

from __future__ import annotations

import json
import os
import sys
import time

if os.environ.get("STDERR_CHARS"):
    sys.stderr.write("E" * int(os.environ["STDERR_CHARS"]) + "\n")
    sys.stderr.flush()
    sys.exit(1)

TOOLS = json.loads(os.environ.get("TOOLS", "[]"))


def answer(message_id: object, *, result: object = None, error: object = None) -> None:
    reply = {"jsonrpc": "2.0", "id": message_id, **({"error": error} if error is not None else {"result": result})}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        answer(
            message["id"],
            result={
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(message["id"], result={"tools": TOOLS})
    elif method == "tools/call" and params.get("name") == "close_ticket":
        answer(message["id"], error={"code": -32602, "message": "ticket T-1 is already closed"})
    elif method == "tools/call":
        if params.get("name") == "slow":
            time.sleep(float((params.get("arguments") or {}).get("s", 1)))
        answer(message["id"], result={"content": [{"type": "text", "text": "ok"}]})
    else:
        answer(message["id"], result={})
