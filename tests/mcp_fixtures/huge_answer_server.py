"""A hand-written stdio MCP server (no SDK on the server side) whose tool ``echo_chars`` answers ``arguments.chars``
Hangul characters (3 bytes each in UTF-8) as one text block, on one line however long (with ``not_utf8`` instead, an
answer holding a byte that is no UTF-8). With ``ID_LAST=1`` each
answer names its request's id after its result (as its last key), not before it. Each request's method is appended
to the file ``LOG``."""

from __future__ import annotations

import json
import os
import sys

LOG = os.environ["LOG"]
ID_LAST = os.environ.get("ID_LAST") == "1"


def answer(message_id: object, result: object) -> None:
    fields = [("result", result), ("id", message_id)] if ID_LAST else [("id", message_id), ("result", result)]
    reply = {"jsonrpc": "2.0", **dict(fields)}
    sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, params = message.get("method"), message.get("params") or {}
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(f"{method}\n")
    if "id" not in message:
        continue
    if method == "initialize":
        answer(
            message["id"],
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "huge-answer", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(message["id"], {"tools": [{"name": "echo_chars", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call" and (params.get("arguments") or {}).get("not_utf8"):
        # A byte that is no UTF-8 inside the answer's text: the line is no message, its id still readable.
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": "A#A"}]}}
        sys.stdout.buffer.write(json.dumps(reply).encode().replace(b"A#A", b"A\xffA") + b"\n")
        sys.stdout.buffer.flush()
    elif method == "tools/call":
        chars = int((params.get("arguments") or {}).get("chars", 1))
        answer(message["id"], {"content": [{"type": "text", "text": "가" * chars}]})
    else:
        answer(message["id"], {})
