"""A hand-written streamable-HTTP MCP endpoint (no SDK on the server side) that misbehaves on purpose, served from a
thread of the test process by :func:`serving`.

On ``/mcp``: ``initialize`` opens a session with an id of its own; a ``tools/call`` of ``ok`` answers "fine" at
once; ``slow`` answers "done" after ``arguments.s`` seconds; ``stream_forever`` answers ``200 text/event-stream``
and then only keep-alive comments, for as long as the client keeps the response open (a server whose tool never
ends, behind a proxy that keeps the stream alive). On ``/login`` every request is answered ``200 text/html`` (a
login page of a proxy in front of the server); on ``/html-on-call`` only ``tools/call`` is.

:class:`HostileHttp` counts what the endpoint saw: the streams open now, each call by tool name and session, the
sessions ended by DELETE, and the ``notifications/cancelled`` it was sent.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class HostileHttp:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lock = threading.Lock()
        self.open_streams = 0
        self.calls: list[tuple[str, str]] = []  # (tool name, session id)
        self.deleted: set[str] = set()
        self.cancelled: list[Any] = []

    def url(self, path: str = "/mcp") -> str:
        return self.base_url + path

    def calls_of(self, tool: str) -> int:
        with self.lock:
            return Counter(name for name, _session in self.calls)[tool]

    def sessions_of(self, tool: str) -> list[str]:
        with self.lock:
            return [session for name, session in self.calls if name == tool]


def _handler(state: HostileHttp) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: str, content_type: str, headers: dict[str, str] | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _answer(self, message_id: Any, result: Any, headers: dict[str, str] | None = None) -> None:
            self._send(
                200, json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}), "application/json", headers
            )

        def do_GET(self) -> None:
            self._send(405, "", "text/plain")

        def do_DELETE(self) -> None:
            with state.lock:
                state.deleted.add(self.headers.get("Mcp-Session-Id", ""))
            self._send(200, "", "text/plain")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?")[0]
            if path == "/login":
                return self._send(200, "<html><body>Please sign in</body></html>", "text/html")
            message = json.loads(body)
            if "id" not in message:
                if message.get("method") == "notifications/cancelled":
                    with state.lock:
                        state.cancelled.append(message["params"].get("requestId"))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            method, params = message["method"], message.get("params") or {}
            if method == "initialize":
                result = {
                    "protocolVersion": params["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile-http", "version": "1"},
                }
                return self._answer(message["id"], result, {"Mcp-Session-Id": uuid.uuid4().hex})
            if method == "tools/list":
                tools = [{"name": name, "inputSchema": {"type": "object"}} for name in ("ok", "slow", "stream_forever")]
                return self._answer(message["id"], {"tools": tools})
            if method != "tools/call":
                return self._answer(message["id"], {})
            if path == "/html-on-call":
                return self._send(200, "<html><body>Gateway login</body></html>", "text/html")
            name = params.get("name", "")
            with state.lock:
                state.calls.append((name, self.headers.get("Mcp-Session-Id", "")))
            if name == "slow":
                time.sleep(float((params.get("arguments") or {}).get("s", 1)))
                return self._answer(message["id"], {"content": [{"type": "text", "text": "done"}]})
            if name == "stream_forever":
                return self._stream_forever()
            return self._answer(message["id"], {"content": [{"type": "text", "text": "fine"}]})

        def _stream_forever(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            with state.lock:
                state.open_streams += 1
            try:
                while True:
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                self.close_connection = True  # the client went away: its stream is closed
            finally:
                with state.lock:
                    state.open_streams -= 1

    return Handler


@contextmanager
def serving() -> Iterator[HostileHttp]:
    """The endpoint on a free loopback port, in a thread, for the ``with`` block."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    state = HostileHttp(f"http://127.0.0.1:{server.server_port}")
    server.RequestHandlerClass = _handler(state)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="hostile-http", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
