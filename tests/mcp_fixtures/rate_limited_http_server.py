"""A hand-written MCP endpoint (no SDK on the server side) that refuses tool calls with HTTP 429 Too Many Requests,
as a rate-limited server or the gateway in front of it does, served from a thread of the test process by
:func:`serving`, over streamable HTTP (``/mcp``, plain JSON answers) and SSE (``/sse``, its messages POSTed to
``/messages``).

Its tools: ``lookup`` (a read), ``book`` (a write whose schema requires ``idempotency_key``, as a payment backend's
does) and ``backup``; its one resource :data:`RESOURCE` (``refuse("resources/read", n)`` refuses its reads, over
streamable HTTP). A ``tools/call`` of a tool with refusals left (:attr:`RateLimited.refusals`; ``initialize``
for the streamable HTTP session's opening) is answered 429
with :attr:`RateLimited.retry_after` as its ``Retry-After`` (``"date+5"``: an HTTP date 5 s after the answer's own
``Date``; empty: no header); any other is answered ``"<tool>: done"``. Over SSE a refusal is the POST's answer, and
nothing comes on the stream.

:class:`RateLimited` records what reached the server: each call as (tool, arguments, session id), refused or not.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STRING = {"type": "string"}
TOOLS = {
    "lookup": {"type": "object", "properties": {"key": STRING}, "required": ["key"]},
    "book": {
        "type": "object",
        "properties": {"seat": STRING, "idempotency_key": STRING},
        "required": ["seat", "idempotency_key"],
    },
    "backup": {"type": "object", "properties": {"key": STRING}, "required": ["key"]},
}


RESOURCE = "notes://runbook"  # its one resource; a read of it is refused as a tool call is (``resources/read``)


class RateLimited:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lock = threading.Lock()
        self.refusals: Counter[str] = Counter()
        self.retry_after = "3"
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.closed = threading.Event()
        self.sse_streams: dict[str, queue.Queue[dict[str, Any]]] = {}

    def url(self, path: str) -> str:
        return self.base_url + path

    def calls_of(self, tool: str) -> list[dict[str, Any]]:
        with self.lock:
            return [arguments for name, arguments, _session in self.calls if name == tool]

    def sessions_of(self, tool: str) -> list[str]:
        with self.lock:
            return [session for name, _arguments, session in self.calls if name == tool]

    def refuse(self, tool: str, times: int) -> None:
        with self.lock:
            self.refusals[tool] = times

    def _take_refusal(self, tool: str) -> bool:
        with self.lock:
            if self.refusals[tool] <= 0:
                return False
            self.refusals[tool] -= 1
            return True


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
                "capabilities": {"tools": {}, "resources": {}},
                "serverInfo": {"name": "rate-limited", "version": "1"},
            },
        )
    if message["method"] == "tools/list":
        return _result(message["id"], {"tools": [{"name": n, "inputSchema": s} for n, s in TOOLS.items()]})
    if message["method"] == "resources/list":
        return _result(message["id"], {"resources": [{"uri": RESOURCE, "name": "runbook"}]})
    if message["method"] == "resources/read":
        return _result(message["id"], {"contents": [{"uri": RESOURCE, "text": "런북: 재시작"}]})
    return _result(message["id"], {})


def _handler(state: RateLimited) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        now = 0.0  # when the request came: the answer's Date, and what an HTTP-date Retry-After counts from

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:
            return email.utils.formatdate(self.now if timestamp is None else timestamp, usegmt=True)

        def _send(self, status: int, data: bytes, content_type: str = "application/json", **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)

        def _refuse(self) -> None:
            retry_after = state.retry_after
            if retry_after.startswith("date+"):
                retry_after = email.utils.formatdate(self.now + float(retry_after[5:]), usegmt=True)
            headers = {"Retry_After": retry_after} if retry_after else {}
            self._send(429, json.dumps({"error": "Too Many Requests"}).encode(), **headers)

        def _read_message(self) -> dict[str, Any]:
            self.now = time.time()
            message: dict[str, Any] = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            return message

        def _record(self, message: dict[str, Any], session: str) -> str:
            params = message.get("params") or {}
            name = str(params.get("name", ""))
            with state.lock:
                state.calls.append((name, dict(params.get("arguments") or {}), session))
            return name

        # ---- streamable HTTP ------------------------------------------------------------------------------------
        def do_POST(self) -> None:
            if self.path.startswith("/messages"):
                return self._sse_post()
            message = self._read_message()
            if "id" not in message:
                return self._send(202, b"")
            if message["method"] == "initialize":
                if state._take_refusal("initialize"):
                    return self._refuse()
                return self._send(200, json.dumps(_answer_to(message)).encode(), Mcp_Session_Id=uuid.uuid4().hex)
            if message["method"] == "resources/read" and state._take_refusal("resources/read"):
                return self._refuse()
            if message["method"] != "tools/call":
                return self._send(200, json.dumps(_answer_to(message)).encode())
            name = self._record(message, self.headers.get("Mcp-Session-Id", ""))
            if state._take_refusal(name):
                return self._refuse()
            done = _result(message["id"], {"content": [{"type": "text", "text": f"{name}: done"}]})
            return self._send(200, json.dumps(done).encode())

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
            session_id = self.path.split("session_id=")[1].split("&")[0]
            stream = state.sse_streams[session_id]
            message = self._read_message()
            if "id" not in message:
                return self._send(202, b"")
            if message["method"] != "tools/call":
                stream.put(_answer_to(message))
                return self._send(202, b"")
            name = self._record(message, session_id)
            if state._take_refusal(name):
                return self._refuse()
            stream.put(_result(message["id"], {"content": [{"type": "text", "text": f"{name}: done"}]}))
            return self._send(202, b"")

    return Handler


@contextmanager
def serving() -> Iterator[RateLimited]:
    """The endpoint on a free loopback port, in a thread, for the ``with`` block."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    state = RateLimited(f"http://127.0.0.1:{server.server_port}")
    server.RequestHandlerClass = _handler(state)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="rate-limited", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.closed.set()
        server.shutdown()
        server.server_close()
