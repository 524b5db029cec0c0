"""A hand-written MCP endpoint (no SDK on the server side) whose answers to ``tools/call`` go wrong on the way, served
from a thread of the test process by :func:`serving`, over streamable HTTP (``/mcp``, plain JSON answers) and SSE
(``/sse``, its messages POSTed to ``/messages``).

The tool named by ``tools/call`` picks what happens: ``ok`` answers "fine"; ``deep`` answers a structured content
nested deeper than the SDK's parser goes; ``invalid_json`` an answer cut short (still ``200``, its length right);
``not_utf8`` an answer with a Latin-1 byte; ``cut_body`` sends its headers (``Content-Length: 500``), ten bytes of
body, and closes the connection; ``hang`` answers only once :attr:`HostileAnswers.release` is set. Over SSE,
``refused_403`` and ``refused_500`` are POSTs the server refuses with that status (nothing comes on the stream).

:class:`HostileAnswers` counts each call by tool name: what reached the server.
"""

from __future__ import annotations

import http.server
import json
import queue
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TOOLS = ("ok", "deep", "invalid_json", "not_utf8", "cut_body", "hang", "refused_403", "refused_500")


class HostileAnswers:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.release = threading.Event()
        self.closed = threading.Event()
        self.sse_streams: dict[str, queue.Queue[dict[str, Any]]] = {}

    def url(self, path: str) -> str:
        return self.base_url + path

    def calls_of(self, tool: str) -> int:
        with self.lock:
            return self.calls[tool]


def _result(message_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": message_id, "result": result}


def _answer_to(message: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request that is not a tool call (``initialize``, ``tools/list``, anything else)."""
    params = message.get("params") or {}
    if message["method"] == "initialize":
        return _result(
            message["id"],
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile-answers", "version": "1"},
            },
        )
    if message["method"] == "tools/list":
        return _result(message["id"], {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]})
    return _result(message["id"], {})


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _level in range(depth):
        value = {"a": value}
    return value


def _handler(state: HostileAnswers) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, data: bytes, content_type: str = "application/json", **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)

        def _read_message(self) -> dict[str, Any]:
            message: dict[str, Any] = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            return message

        def _count(self, message: dict[str, Any]) -> str:
            name = str((message.get("params") or {}).get("name", ""))
            with state.lock:
                state.calls[name] += 1
            return name

        # ---- streamable HTTP ------------------------------------------------------------------------------------
        def do_POST(self) -> None:
            if self.path.startswith("/messages"):
                return self._sse_post()
            message = self._read_message()
            if "id" not in message:
                return self._send(202, b"")
            if message["method"] == "initialize":
                answer = json.dumps(_answer_to(message)).encode()
                return self._send(200, answer, Mcp_Session_Id=uuid.uuid4().hex)
            if message["method"] != "tools/call":
                return self._send(200, json.dumps(_answer_to(message)).encode())
            self._call(self._count(message), message["id"])

        def _call(self, name: str, message_id: int) -> None:
            head = b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [' % message_id
            if name == "deep":
                deep = _result(message_id, {"content": [], "structuredContent": _nested(300)})
                return self._send(200, json.dumps(deep).encode())
            if name == "invalid_json":
                return self._send(200, head)
            if name == "not_utf8":
                return self._send(200, head + b'{"type": "text", "text": "caf\xe9"}]}}')
            if name == "cut_body":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "500")
                self.end_headers()
                self.wfile.write(head[:10])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return None
            if name == "hang":
                state.release.wait(timeout=30)
            fine = _result(message_id, {"content": [{"type": "text", "text": "fine"}]})
            return self._send(200, json.dumps(fine).encode())

        def do_DELETE(self) -> None:
            self._send(200, b"")

        # ---- SSE ------------------------------------------------------------------------------------------------
        def do_GET(self) -> None:
            if not self.path.startswith("/sse"):
                return self._send(405, b"")
            session_id = uuid.uuid4().hex
            stream: queue.Queue[dict[str, Any]] = queue.Queue()
            state.sse_streams[session_id] = stream
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            try:
                self.wfile.write(f"event: endpoint\ndata: /messages?session_id={session_id}\n\n".encode())
                self.wfile.flush()
                while not state.closed.is_set():
                    try:
                        message = stream.get(timeout=0.2)
                    except queue.Empty:
                        self.wfile.write(b": keep-alive\n\n")
                    else:
                        self.wfile.write(b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n")
                    self.wfile.flush()
            except OSError:
                pass  # the client went away
            self.close_connection = True
            return None

        def _sse_post(self) -> None:
            stream = state.sse_streams[self.path.split("session_id=")[1].split("&")[0]]
            message = self._read_message()
            if "id" not in message:
                return self._send(202, b"")
            if message["method"] != "tools/call":
                stream.put(_answer_to(message))
                return self._send(202, b"")
            name = self._count(message)
            if name in ("refused_403", "refused_500"):
                return self._send(int(name[-3:]), b"refused", "text/plain")
            stream.put(_result(message["id"], {"content": [{"type": "text", "text": "fine"}]}))
            return self._send(202, b"")

    return Handler


@contextmanager
def serving() -> Iterator[HostileAnswers]:
    """The endpoint on a free loopback port, in a thread, for the ``with`` block."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    state = HostileAnswers(f"http://127.0.0.1:{server.server_port}")
    server.RequestHandlerClass = _handler(state)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="hostile-answers", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        state.closed.set()
        server.shutdown()
        server.server_close()
