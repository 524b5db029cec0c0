"""HTTP answers that are not the answer asked for: an HTTP error, and a JSON-RPC answer that is not the request's.

1. A server that answers an HTTP error (a 403 on a call, on initialize; a 403 to an SSE stream) failed its request
   with httpx's text, which quotes the URL whole: its query (``?token=…``) and its user-info (``user:pass@``), which
   may be credentials that are no stored secret of the binding (the URL is neither env nor a header), so masking
   need not catch them (``?k=…``). Now the failure names the server by its ``mcp_id``, the status, and the URL
   without its query, fragment and user-info.
2. A streamable HTTP server that answers a ``tools/call`` with a JSON-RPC answer whose id is not the request's (or
   that has none) left the request waiting for its whole timeout, to fail as ``timeout`` (an approved write:
   ``outcome_unknown``), though the server had answered. Now the call fails at once as an answer that is not what
   was asked (``ToolResultInvalid``: the gate's ``result:shape``), sent once and never again.

The server here is hand-written (no SDK on the server side), served from a thread of the test process.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from django.utils import translation
from mcp import McpError

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Run
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry.client_session import ToolResultInvalid
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpSessionPool, McpTransportError
from tests.conftest import discover_as_admin, make_agent

# Long enough that a request left to its deadline fails these tests as a timeout, not as what it should have been.
CALL_TIMEOUT_S = 5.0
# A credential in the URL that no masking pattern knows (the parameter's name says nothing), and one in user-info.
URL_SECRET = "q8Zr2vXw5LmN"
USER_SECRET = "s3cr3t-Pw-9x"

MOVED_TO = f"ops:{USER_SECRET}"

TOOLS = ("ok", "forbidden", "wrong_id", "no_id", "null_id_error", "wrong_id_stream", "hang", "previous_id")


class AnswersEndpoint:
    """What reached the server: each ``tools/call`` counted by tool name."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.release = threading.Event()

    def url(self, path: str, *, userinfo: str = "") -> str:
        return self.base_url.replace("://", f"://{userinfo}@" if userinfo else "://") + path

    def calls_of(self, tool: str) -> int:
        with self.lock:
            return self.calls[tool]


def _result(message_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": message_id, "result": result}


FINE = {"content": [{"type": "text", "text": "fine"}]}


def _answer_to(message: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request that is not a tool call (``initialize``, ``tools/list``, anything else)."""
    params = message.get("params") or {}
    if message["method"] == "initialize":
        return _result(
            message["id"],
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "wrong-answers", "version": "1"},
            },
        )
    if message["method"] == "tools/list":
        return _result(message["id"], {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]})
    return _result(message["id"], {})


def _handler(state: AnswersEndpoint) -> type[http.server.BaseHTTPRequestHandler]:
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

        def _send_json(self, message: dict[str, Any]) -> None:
            self._send(200, json.dumps(message).encode())

        def do_GET(self) -> None:
            if self.path.startswith("/sse"):
                return self._send(403, b"forbidden", "text/plain")
            return self._send(405, b"")  # no stream of the server's own: everything comes in answers

        def do_DELETE(self) -> None:
            self._send(200, b"")

        def do_POST(self) -> None:
            message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path.startswith("/forbidden"):
                return self._send(403, b"forbidden", "text/plain")
            if self.path.startswith("/moved"):  # to another origin, the query kept: not followed by the SDK
                return self._send(
                    307, b"", "text/plain", Location=f"http://{MOVED_TO}@elsewhere.example/mcp?k={URL_SECRET}"
                )
            if "id" not in message:
                return self._send(202, b"")
            if message["method"] == "initialize":
                return self._send(200, json.dumps(_answer_to(message)).encode(), Mcp_Session_Id=uuid.uuid4().hex)
            if message["method"] != "tools/call":
                return self._send_json(_answer_to(message))
            name = str((message.get("params") or {}).get("name", ""))
            with state.lock:
                state.calls[name] += 1
            self._call(name, message["id"])
            return None

        def _call(self, name: str, message_id: int) -> None:
            if name == "forbidden":
                return self._send(403, b"forbidden", "text/plain")
            if name == "wrong_id":
                return self._send_json(_result(message_id + 1000, FINE))
            if name == "no_id":
                return self._send_json({"jsonrpc": "2.0", "result": FINE})
            if name == "null_id_error":
                return self._send_json({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse"}})
            if name == "previous_id":  # the id of the request sent just before: another call's, still waiting
                return self._send_json(_result(message_id - 1, {"content": [{"type": "text", "text": "not yours"}]}))
            if name == "hang":
                state.release.wait(timeout=30)
            if name == "wrong_id_stream":
                event = b"event: message\ndata: " + json.dumps(_result(message_id + 1000, FINE)).encode() + b"\n\n"
                return self._send(200, event, "text/event-stream")
            return self._send_json(_result(message_id, FINE))

    return Handler


@contextmanager
def serving() -> Iterator[AnswersEndpoint]:
    """The endpoint on a free loopback port, in a thread, for the ``with`` block."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    state = AnswersEndpoint(f"http://127.0.0.1:{server.server_port}")
    server.RequestHandlerClass = _handler(state)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="wrong-answers", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def endpoint() -> Iterator[AnswersEndpoint]:
    with serving() as state:
        yield state


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def in_korean(msgid: str, **params: str) -> str:
    with translation.override("ko"):
        return translation.gettext(msgid) % params


def http_config(endpoint: AnswersEndpoint, path: str = "/mcp") -> dict[str, Any]:
    # No user-info: a binding's URL holding one is refused before it connects (``binding_problem``).
    url = endpoint.url(f"{path}?k={URL_SECRET}#frag")
    return {"mcp_id": "answers-http", "transport": "streamable_http", "url": url, "headers": {}}


def sse_config(endpoint: AnswersEndpoint) -> dict[str, Any]:
    url = endpoint.url(f"/sse?k={URL_SECRET}")
    return {"mcp_id": "answers-sse", "transport": "sse", "url": url, "headers": {}}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()


def assert_no_credential_in(text: str) -> None:
    assert URL_SECRET not in text and USER_SECRET not in text
    assert "ops@" not in text and "k=" not in text and "#frag" not in text


# ---- 1. an HTTP error names the server and its address, never the address's query or user-info -----------------
def test_an_http_error_to_a_call_names_the_status_and_the_address_without_its_credentials(
    endpoint: AnswersEndpoint, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"

    with pytest.raises(McpError) as refused:
        pool.call_tool(config, "forbidden", {}, timeout_s=CALL_TIMEOUT_S)

    address = endpoint.url("/mcp")
    # The server's refusal of this request (not processed); the session goes on for the others.
    assert str(refused.value) == f"server 'answers-http' refused the request: HTTP 403 Forbidden from {address}"
    assert_no_credential_in(str(refused.value))
    assert endpoint.calls_of("forbidden") == 1
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"


@pytest.mark.parametrize(
    ("config_of", "path"), [(http_config, "/forbidden"), (sse_config, "/sse")], ids=["streamable_http", "sse"]
)
def test_an_http_error_to_the_session_s_opening_names_the_address_without_its_credentials(
    endpoint: AnswersEndpoint, pool: McpSessionPool, config_of: Callable[..., dict[str, Any]], path: str
) -> None:
    config = config_of(endpoint, path) if path == "/forbidden" else config_of(endpoint)

    with pytest.raises(McpTransportError) as refused:
        pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S)

    said = f"server '{config['mcp_id']}' could not be reached: HTTP 403 Forbidden from {endpoint.url(path)}"
    assert str(refused.value) == said
    assert_no_credential_in(str(refused.value))
    assert refused.value.sent is False


def test_a_redirect_that_is_not_followed_names_both_addresses_without_their_credentials(
    endpoint: AnswersEndpoint, pool: McpSessionPool
) -> None:
    with pytest.raises(McpTransportError) as refused:
        pool.call_tool(http_config(endpoint, "/moved"), "ok", {}, timeout_s=CALL_TIMEOUT_S)

    said = (
        f"server 'answers-http' could not be reached: HTTP 307 Temporary Redirect from {endpoint.url('/moved')}, "
        "a redirect to http://elsewhere.example/mcp that is not followed"
    )
    assert str(refused.value) == said
    assert_no_credential_in(str(refused.value))


@pytest.mark.django_db
def test_a_discovery_refused_with_an_http_error_stores_no_credential_of_the_url(endpoint: AnswersEndpoint) -> None:
    server = McpServer.objects.create(
        mcp_id="answers-refused",
        name="answers-refused",
        transport=McpServer.Transport.STREAMABLE_HTTP,
        url=http_config(endpoint, "/forbidden")["url"],
        timeout_s=CALL_TIMEOUT_S,
    )
    assert not discover_as_admin(server=server).ok

    server.refresh_from_db()
    assert URL_SECRET not in server.last_error  # masking does not know it
    assert "HTTP 403 Forbidden from " + endpoint.url("/forbidden") in server.last_error
    assert_no_credential_in(server.last_error)


# ---- 2. an answer that is not the request's fails it at once, as an answer that is not what was asked ------------
@pytest.mark.parametrize(
    ("tool", "said"),
    [
        ("wrong_id", "the server's answer to request {request} carries another id: {other}"),
        ("wrong_id_stream", "the server's answer to request {request} carries another id: {other}"),
        ("no_id", "the server's answer to request {request} carries no id"),
        ("null_id_error", "the server's answer to request {request} carries no id; the server said: Parse"),
    ],
)
def test_an_answer_that_names_another_request_or_none_fails_the_call_at_once_as_sent_and_answered(
    endpoint: AnswersEndpoint, pool: McpSessionPool, tool: str, said: str
) -> None:
    config = http_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"

    with pytest.raises(ToolResultInvalid) as unmatched:  # it was a timeout, at the end of the whole deadline
        pool.call_tool(config, tool, {}, timeout_s=CALL_TIMEOUT_S)

    request = int(re.findall(r"\d+", str(unmatched.value))[0])
    assert str(unmatched.value) == said.format(request=request, other=request + 1000)
    assert endpoint.calls_of(tool) == 1
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"  # the session still serves


def test_an_answer_with_the_id_of_another_call_in_flight_is_not_taken_for_that_call_s_answer(
    endpoint: AnswersEndpoint, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    with ThreadPoolExecutor(max_workers=1) as executor:
        hanging = executor.submit(pool.call_tool, config, "hang", {}, timeout_s=CALL_TIMEOUT_S)
        assert wait_for(lambda: endpoint.calls_of("hang") == 1)

        with pytest.raises(ToolResultInvalid, match="carries another id"):
            pool.call_tool(config, "previous_id", {}, timeout_s=CALL_TIMEOUT_S)
        endpoint.release.set()

        assert hanging.result().text == "fine"  # its own answer, not "not yours"
    assert endpoint.calls_of("hang") == 1


def test_the_pool_says_an_unmatched_answer_in_the_caller_s_language(
    endpoint: AnswersEndpoint, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"  # the session opened in English

    with translation.override("ko"), pytest.raises(ToolResultInvalid) as unmatched:
        pool.call_tool(config, "no_id", {}, timeout_s=CALL_TIMEOUT_S)

    request = re.search(r"\d+", str(unmatched.value))
    assert request is not None
    said = in_korean("the server's answer to request %(request)s carries no id", request=request[0])
    assert str(unmatched.value) == said
    assert "carries" not in said


# ---- through the gate: what is recorded and shown; a write sent once -----------------------------------------
def approved_write_run(endpoint: AnswersEndpoint, tool: str) -> Run:
    """A run whose (scripted) model calls the write ``tool`` once, approved, then answers with what it gave back."""
    server = McpServer.objects.create(
        mcp_id="answers-write",
        name="answers-write",
        transport=McpServer.Transport.STREAMABLE_HTTP,
        url=http_config(endpoint)["url"],
        timeout_s=CALL_TIMEOUT_S,
        session_scope=McpServer.SessionScope.PER_RUN,
    )
    assert discover_as_admin(server=server).ok
    assert ToolContract.objects.get(tool__server=server, tool__name=tool).risk == "write"
    key, _raw = api_key_create(actor="test-admin", via="tests", name="writer")
    agent = make_agent(
        slug="answers-writer",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": tool, "args": {}}]}, {"content": "diagnostic: {last_tool_result}"}],
    )
    run = Run.objects.create(agent=agent, api_key=key, query="do it")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == "awaiting_approval"
    approval_decide(run=run, approval_id=str(run.approvals.get().pk), decision="approve", actor="test-admin")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def everything_recorded(run: Run) -> str:
    """The run's audit events, its own row (answer, error, tool calls), its events and its approvals, as text."""
    recorded = [
        list(AuditEvent.objects.filter(run_id=run.id).values()),
        list(Run.objects.filter(pk=run.pk).values()),
        list(run.events.values()),
        list(run.approvals.values()),
    ]
    return json.dumps(recorded, default=str, ensure_ascii=False)


@pytest.mark.django_db
def test_a_write_refused_with_an_http_error_records_and_shows_no_credential_of_the_url(
    endpoint: AnswersEndpoint,
) -> None:
    run = approved_write_run(endpoint, "forbidden")

    assert endpoint.calls_of("forbidden") == 1  # refused, not sent again
    assert run.approvals.get().status == "executed"  # answered with a refusal: known not carried out
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason) == (False, "protocol")
    recorded = everything_recorded(run)
    assert URL_SECRET not in recorded and USER_SECRET not in recorded  # masking knows neither
    # The status and the address without its query or user-info, in the run's language (the agent's: Korean).
    assert "HTTP 403 Forbidden" in recorded and endpoint.url("/mcp") in recorded


@pytest.mark.django_db
def test_an_approved_write_answered_with_another_id_is_sent_once_and_fails_as_its_answer_s_shape(
    endpoint: AnswersEndpoint,
) -> None:
    run = approved_write_run(endpoint, "wrong_id")

    assert endpoint.calls_of("wrong_id") == 1
    assert run.approvals.get().status == "executed"  # answered: not of unknown outcome
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason) == (False, "result:shape")


# ---- the SDK code the pool copies and wraps ----------------------------------------------------------------------

# What the pool's ``_streamable_http_streams`` copies and ``_StreamableHttpTransport`` wraps, as mcp 1.30.0 has it
# (requirements.txt pins it): an upgrade that changes either fails here, so the copy is redone, not left to drift.
SDK_SOURCES = {
    "streamable_http_client": "2bed9f095da55e361c51ec9670b95b62c4290f2c354b5f4a40eb3b855d6cd391",
    "StreamableHTTPTransport._handle_post_request": "b61199fdb38bd33135d879393f4708617252128718858fb307c7cde3adac5b40",
}


def test_the_sdk_code_the_pool_copies_is_the_code_it_was_copied_from() -> None:
    import hashlib
    import inspect

    from mcp.client import streamable_http

    found = {
        function.__qualname__: hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
        for function in (
            streamable_http.streamable_http_client,
            streamable_http.StreamableHTTPTransport._handle_post_request,
        )
    }
    assert found == SDK_SOURCES, (
        "the MCP SDK's streamable HTTP client changed: redo mcpregistry/pool.py's _streamable_http_streams (a copy "
        "of streamable_http_client) and _StreamableHttpTransport (which overrides _handle_post_request) from it, "
        "then update SDK_SOURCES"
    )
