"""The streamable HTTP pool decides what happened to a request from what its transport saw, never from a server's words
(review s42, ``httppool``).

1. A server's JSON-RPC error whose words said "session terminated" (code -32600) was read as the session's end: the
   request was sent again on a fresh session, a write included, and the gate retried it (6 sends of one write).
2. One HTTP 4xx on one request ended the whole session: every call in flight on it failed as a broken transport (a
   finished write's outcome made unknown). A 5xx did the same.
3. server-everything (the TypeScript SDK) answers an unknown session id with HTTP 400, not 404: after its restart the
   next write failed as of unknown outcome, though the server never processed it.
4. An international host name was shown in its ``xn--`` form in health errors.
5. A URL's user and password were not checked again at connect (httpx sent them as Basic auth).

The servers are real HTTP servers (a scriptable ``http.server`` one, and server-everything); only their answers are
scripted.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from mcp import McpError

from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpRateLimited, McpSessionPool, McpTransportError, get_default_pool
from mcpregistry.services import mcp_server_create, mcp_server_health_check
from tests.conftest import discover_as_admin

if TYPE_CHECKING:  # imported by pytest_plugins below, so that pytest rewrites its asserts
    from tests.thirdparty import EverythingServer

pytest_plugins = ["tests.thirdparty"]

TS_SESSION_NOT_VALID = {"code": -32000, "message": "Bad Request: No valid session ID provided"}


class FakeServer:
    """A streamable HTTP MCP server on 127.0.0.1 whose answers a test scripts (``on_call``); it records every POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.calls: list[str] = []  # the tools/call it carried out (refused ones are not)
        self.session = "sess-1"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def send(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self.send(405)

            def do_DELETE(self) -> None:
                self.send(200)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                message = json.loads(body or b"{}")
                fake.posts.append((dict(self.headers), message))
                fake.handle(self, message)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def initializes(self) -> int:
        return sum(1 for _headers, message in self.posts if message.get("method") == "initialize")

    @staticmethod
    def answer(
        handler: Any, message: dict[str, Any], result: dict[str, Any], headers: tuple[str, str] | None = None
    ) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        if headers is not None:
            handler.send_header(*headers)
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def handle(self, handler: Any, message: dict[str, Any]) -> None:
        method = message.get("method")
        if "id" not in message:
            handler.send(202)
            return
        if method == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "1"},
            }
            return self.answer(handler, message, result, headers=("mcp-session-id", self.session))
        if method == "tools/list":
            tools = [{"name": "post_payroll", "inputSchema": {"type": "object", "properties": {"amount": {}}}}]
            return self.answer(handler, message, {"tools": tools})
        if method == "tools/call":
            return self.on_call(handler, message)
        error = {"code": -32601, "message": "no such method"}
        handler.send(200, json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}).encode())

    def on_call(self, handler: Any, message: dict[str, Any]) -> None:
        self.calls.append(message["params"]["name"])
        self.answer(handler, message, {"content": [{"type": "text", "text": "done"}]})

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def error_body(request_id: Any, error: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=60)
    yield pool
    pool.shutdown()


def config(server: FakeServer, mcp_id: str = "fake") -> dict[str, Any]:
    return {"mcp_id": mcp_id, "transport": "streamable_http", "url": server.url, "headers": {}}


# ---- 1. a server's words never end its session ----------------------------------------------------------------


class SaysSessionTerminated(FakeServer):
    """Carries out the write, then answers (HTTP 200) a JSON-RPC error whose words say "session terminated"."""

    def on_call(self, handler: Any, message: dict[str, Any]) -> None:
        self.calls.append(message["params"]["name"])
        handler.send(200, error_body(message["id"], {"code": -32600, "message": "급여 처리 후 session terminated"}))


@pytest.mark.django_db
def test_a_write_answered_with_session_terminated_words_is_sent_once() -> None:
    server = SaysSessionTerminated()
    try:
        binding = McpServer.objects.create(
            mcp_id="payroll", name="payroll", transport="streamable_http", url=server.url, timeout_s=5
        )
        assert discover_as_admin(server=binding).ok
        assert ToolContract.objects.get(tool__server=binding, tool__name="post_payroll").risk == "write"
        binding = McpServer.objects.prefetch_related("tools__contract").get(pk=binding.pk)
        who: Any = gate.GateCall(
            source="eval",  # type: ignore[arg-type]  # an eval run's purpose, as the engine's ``who`` gives it
            run_id=uuid.uuid4(),
            call_id="c1",
            writes_blocked=True,
            write_sandbox=frozenset({"payroll"}),
        )
        result = gate.call(server=binding, tool_name="post_payroll", args={"amount": 1}, who=who)
        # The server's answer: a protocol error, never a session that ended (6 sends before).
        assert (result.ok, result.error, result.attempts) == (False, "protocol", 1)
        assert server.calls == ["post_payroll"]
    finally:
        get_default_pool().close("payroll")
        server.stop()


class SaysRateLimited(FakeServer):
    """Carries out the call, then answers (HTTP 200) an error whose ``data`` is the pool's own rate-limit marker."""

    def on_call(self, handler: Any, message: dict[str, Any]) -> None:
        self.calls.append(message["params"]["name"])
        data = {"platform": "platform:rate_limited", "status": "HTTP 429", "url": "", "retry_after_s": 0}
        handler.send(200, error_body(message["id"], {"code": -32603, "message": "HTTP 429", "data": data}))


def test_a_server_s_error_dressed_as_the_pool_s_rate_limit_is_its_answer(pool: McpSessionPool) -> None:
    server = SaysRateLimited()
    try:
        with pytest.raises(McpError) as raised:
            pool.call_tool(config(server), "post_payroll", {}, timeout_s=5)
        assert not isinstance(raised.value, McpRateLimited)  # was: a rate limit, sent=False (retried by the gate)
        assert server.calls == ["post_payroll"]
    finally:
        server.stop()


# ---- 2. one request's HTTP error is that request's -----------------------------------------------------------


class RefusesOne(FakeServer):
    """``write`` waits until ``release`` is set, then is carried out; ``refused`` is answered with ``status`` and
    ``body`` (``{id}`` in it replaced by the request's id)."""

    def __init__(self, status: int, body: str, content_type: str = "application/json") -> None:
        super().__init__()
        self.status, self.body, self.content_type = status, body, content_type
        self.release = threading.Event()

    def on_call(self, handler: Any, message: dict[str, Any]) -> None:
        name = message["params"]["name"]
        if name == "refused":
            body = self.body.replace("{id}", json.dumps(message["id"]))
            handler.send(self.status, body.encode(), self.content_type)
            return
        self.release.wait(10)
        self.calls.append(name)
        return self.answer(handler, message, {"content": [{"type": "text", "text": "written"}]})


def call_beside_a_refusal(pool: McpSessionPool, server: RefusesOne) -> tuple[Any, BaseException]:
    """A ``write`` in flight while ``refused`` is refused: what each came to."""
    pool.list_tools(config(server), timeout_s=5)
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            outcome["write"] = pool.call_tool(config(server), "write", {}, timeout_s=10).text
        except Exception as exc:  # noqa: BLE001 - what the write came to, asserted below
            outcome["write"] = exc

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 5
    while not any(m.get("params", {}).get("name") == "write" for _h, m in server.posts) and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(Exception) as refused:
        pool.call_tool(config(server), "refused", {}, timeout_s=10)
    server.release.set()
    writer.join(timeout=15)
    return outcome["write"], refused.value


def test_a_4xx_with_a_json_rpc_error_is_that_call_s_answer_and_the_write_beside_it_stands(
    pool: McpSessionPool,
) -> None:
    server = RefusesOne(400, '{"jsonrpc": "2.0", "id": {id}, "error": {"code": -32602, "message": "bad args"}}')
    try:
        written, refused = call_beside_a_refusal(pool, server)
        assert isinstance(refused, McpError) and str(refused) == "bad args"
        assert written == "written"  # was: McpTransportError sent=True, though the server wrote it
        assert server.calls == ["write"]
        assert pool.call_tool(config(server), "write", {}, timeout_s=5).text == "written"
        assert server.initializes() == 1  # the session went on
    finally:
        server.release.set()
        server.stop()


def test_a_4xx_without_an_answer_fails_that_call_as_not_sent_and_the_session_goes_on(pool: McpSessionPool) -> None:
    server = RefusesOne(403, "<html>forbidden</html>", "text/html")
    try:
        written, refused = call_beside_a_refusal(pool, server)
        # The server's refusal (the gate's protocol: not sent again, not counted by the breaker), not a transport
        # failure: it was not processed, and the server is there.
        assert isinstance(refused, McpError), refused
        assert "HTTP 403 Forbidden from http://127.0.0.1" in str(refused)
        assert written == "written"
        assert server.initializes() == 1
    finally:
        server.release.set()
        server.stop()


def test_a_5xx_fails_that_call_as_of_unknown_outcome_and_the_write_beside_it_stands(pool: McpSessionPool) -> None:
    server = RefusesOne(502, "<html>bad gateway</html>", "text/html")
    try:
        written, refused = call_beside_a_refusal(pool, server)
        assert isinstance(refused, McpTransportError) and refused.sent is True  # it may have been processed
        assert "HTTP 502 Bad Gateway" in str(refused)
        assert written == "written"  # was: McpTransportError sent=True
        assert server.calls == ["write"]
    finally:
        server.release.set()
        server.stop()


# ---- 3. the TypeScript SDK's 400 for an unknown session ------------------------------------------------------


class Restarts(FakeServer):
    """Forgets its sessions (``restart``) and then answers a POST carrying an unknown session id as the TypeScript
    SDK's servers do: HTTP 400, ``TS_SESSION_NOT_VALID``, its id ``answer_id`` ("own": the request's, "none": no id,
    as server-everything answers)."""

    def __init__(self, answer_id: Any) -> None:
        super().__init__()
        self.answer_id = answer_id

    def restart(self) -> None:
        self.session = f"sess-{uuid.uuid4().hex}"

    def handle(self, handler: Any, message: dict[str, Any]) -> None:
        sent = handler.headers.get("mcp-session-id")
        if sent is not None and sent != self.session:
            request_id = message.get("id") if self.answer_id == "own" else self.answer_id
            body: dict[str, Any] = {"jsonrpc": "2.0", "error": TS_SESSION_NOT_VALID}
            body |= {} if self.answer_id == "none" else {"id": request_id}
            handler.send(400, json.dumps(body).encode())
            return
        return super().handle(handler, message)


@pytest.mark.parametrize("answer_id", [None, "own", "none"])
def test_a_write_after_a_typescript_server_forgot_the_session_goes_out_once_on_a_new_one(
    pool: McpSessionPool, answer_id: Any
) -> None:
    server = Restarts(answer_id)
    try:
        pool.list_tools(config(server), timeout_s=5)
        server.restart()
        outcome = pool.call_tool(config(server), "post_payroll", {"amount": 1}, timeout_s=5)
        assert outcome.text == "done"  # was: McpTransportError sent=True (outcome unknown)
        assert server.calls == ["post_payroll"]
        assert server.initializes() == 2
    finally:
        server.stop()


class SaysSessionNotValidAfterWriting(FakeServer):
    """Carries out the call, then answers with the TypeScript SDK's words, in an HTTP 200."""

    def on_call(self, handler: Any, message: dict[str, Any]) -> None:
        self.calls.append(message["params"]["name"])
        handler.send(200, error_body(message["id"], TS_SESSION_NOT_VALID))


def test_the_typescript_sdk_s_words_in_a_200_answer_are_the_server_s_answer(pool: McpSessionPool) -> None:
    server = SaysSessionNotValidAfterWriting()
    try:
        with pytest.raises(McpError):
            pool.call_tool(config(server), "post_payroll", {}, timeout_s=5)
        assert server.calls == ["post_payroll"]
        assert server.initializes() == 1
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.thirdparty
def test_a_call_after_server_everything_restarted_goes_out_once_on_a_new_session(
    everything_server: EverythingServer, pool: McpSessionPool
) -> None:
    from tests.thirdparty import _port_answers, _stop, free_port  # loaded as a plugin (pytest_plugins)

    port = free_port()
    command = everything_server.streamable_http(port)
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ} | command.env

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [command.command, *command.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 20
        while process.poll() is None and not _port_answers(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        return process

    process = start()
    binding = {"mcp_id": "everything", "transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp"}
    try:
        assert pool.call_tool(binding, "echo", {"message": "첫째"}, timeout_s=10).text.endswith("첫째")
        _stop(process)
        process = start()
        # It answers the old session's id with HTTP 400: a new session, and the call sent there once.
        assert pool.call_tool(binding, "echo", {"message": "둘째"}, timeout_s=10).text.endswith("둘째")
    finally:
        pool.shutdown()
        _stop(process)


# ---- 4. an international host name as written ----------------------------------------------------------------


class Unauthorized(FakeServer):
    def handle(self, handler: Any, message: dict[str, Any]) -> None:
        handler.send(401, b"{}")


@pytest.mark.django_db
def test_a_health_error_shows_an_international_host_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = Unauthorized()  # every request goes through it: no DNS for the name
    monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/mcp"))
    for name in ("NO_PROXY", "no_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    try:
        binding = mcp_server_create(
            actor="t",
            via="tests",
            data={"mcp_id": "idn", "name": "idn", "transport": "streamable_http", "url": "http://사내도구.한국/mcp"},
        )
        error = mcp_server_health_check(server=binding).error
        assert "HTTP 401 Unauthorized from http://사내도구.한국/mcp" in error
        assert "xn--" not in error
    finally:
        get_default_pool().close("idn")
        proxy.stop()


# ---- 5. a URL's user and password, checked again at connect ---------------------------------------------------


def test_a_url_with_a_user_and_password_is_refused_at_connect(pool: McpSessionPool) -> None:
    server = FakeServer()
    try:
        binding = config(server) | {"url": f"http://payroll:s3cret-pass@127.0.0.1:{server.port}/mcp"}
        with pytest.raises(McpTransportError) as refused:
            pool.list_tools(binding, timeout_s=5)
        assert refused.value.sent is False and "refused by the binding policy" in str(refused.value)
        assert server.posts == []  # nothing sent (was: connected, with Basic auth)
    finally:
        server.stop()
