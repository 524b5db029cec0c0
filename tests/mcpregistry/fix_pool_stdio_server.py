"""A stdio MCP server written by hand (no SDK: it starts in milliseconds), for ``test_fix_pool_review.py``.

Tools: ``echo`` answers its ``text``; ``pid`` answers the server's process id; ``wait_for_file`` answers ``released``
once the file at its ``path`` exists (in a thread: the server reads on meanwhile). With ``HELPER_PIDS`` in its
environment, the server starts a helper process first (it inherits the server's stderr, as a server's children do) and
writes ``<server pid> <helper pid>`` there. The server ends when its stdin closes, leaving its helper running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("echo", "pid", "wait_for_file")]
_write = threading.Lock()


def send(message: dict[str, Any]) -> None:
    with _write:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def text_result(message_id: Any, text: str) -> None:
    send({"jsonrpc": "2.0", "id": message_id, "result": {"content": [{"type": "text", "text": text}]}})


def wait_for_file(message_id: Any, path: str) -> None:
    while not Path(path).exists():
        time.sleep(0.01)
    text_result(message_id, "released")


def handle(message: dict[str, Any]) -> None:
    message_id, method, params = message.get("id"), message.get("method"), message.get("params") or {}
    if message_id is None:
        return  # a notification
    if method == "initialize":
        result = {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fix-pool", "version": "1"},
        }
        send({"jsonrpc": "2.0", "id": message_id, "result": result})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": message_id, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name == "pid":
            text_result(message_id, str(os.getpid()))
        elif name == "wait_for_file":
            threading.Thread(target=wait_for_file, args=(message_id, arguments["path"]), daemon=True).start()
        else:
            text_result(message_id, str(arguments.get("text", "")))
    else:
        send({"jsonrpc": "2.0", "id": message_id, "result": {}})


def main() -> None:
    if pids := os.environ.get("HELPER_PIDS"):
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        helper = subprocess.Popen(sleeper, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        Path(pids).write_text(f"{os.getpid()} {helper.pid}")
    for line in sys.stdin:
        handle(json.loads(line))


if __name__ == "__main__":
    main()
