"""Bad inputs and faults: servers that cannot start, exit mid-call, write garbage, hang in ``initialize`` or list a
malformed tool schema; HTTP servers that are down or answer 401/500.

For each fault the platform must give (1) a health error on the binding after ``mcp_server_discover``, in words
a person understands, (2) a failure value in a run (the run still succeeds with the diagnostic text; the gate
audits the call with ``ok=False`` and a reason code) and (3) no server process left behind.

The servers are real processes (``tests/mcp_fixtures``) and real HTTP sockets; only the model is scripted. A run
calls a tool as an earlier discovery recorded it, before the server broke (or, where listing still works, as this
discovery recorded it).
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry import pool as pool_module
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import McpSessionPool, _StderrPipe
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

PROBE_SERVER = "tests.mcp_fixtures.probe_server"
MALFORMED_SCHEMA_SERVER = "tests.mcp_fixtures.malformed_schema_server"
CALL_TIMEOUT_S = 3.0
# The pool gives a session at least 30 s to initialize whatever the binding's timeout; the tests that wait for
# an initialize that never comes lower that floor (``short_initialize_deadline``) to keep the file fast. (The
# probe's modes that never answer start without importing FastMCP: no start is cut short by this deadline.)
INITIALIZE_DEADLINE_S = 0.5
TERMINATION_GRACE_S = 0.5
ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}
SECRET_TOKEN = "Bearer tok-faults-3c9e71a0b5d24f68"


# ---- helpers ---------------------------------------------------------------------------------------------------
def stdio_binding(mcp_id: str, *, module: str = PROBE_SERVER, **env: str) -> McpServer:
    """A per-run binding to a stdio fixture server (``env`` picks its misbehaviour)."""
    return McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", module],
        cwd=str(settings.BASE_DIR),
        env=env,
        public_env=list(env),  # the misbehaviour it picks is a setting, not a secret
        timeout_s=CALL_TIMEOUT_S,
        session_scope=McpServer.SessionScope.PER_RUN,
    )


def http_binding(mcp_id: str, url: str, *, transport: str, headers: dict[str, str] | None = None) -> McpServer:
    return McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        transport=transport,
        url=url,
        headers=headers or {},
        timeout_s=CALL_TIMEOUT_S,
        session_scope=McpServer.SessionScope.PER_RUN,
    )


def record_tool(server: McpServer, name: str = "echo", schema: dict[str, Any] | None = None) -> McpTool:
    """The tool as an earlier discovery recorded it, while the server still worked."""
    return McpTool.objects.create(
        server=server, name=name, description="Returns its argument.", input_schema=schema or ECHO_SCHEMA
    )


def discovered(server: McpServer) -> McpServer:
    discover_as_admin(server=server)
    server.refresh_from_db()
    return server


def run_calling(server: McpServer, tool: str = "echo", args: dict[str, Any] | None = None) -> Run:
    """A run whose (scripted) model calls ``tool`` once, then answers with whatever the tool call gave back."""
    agent = make_agent(
        slug=f"calls-{server.mcp_id}"[:64],
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": tool, "args": args if args is not None else {"text": "hello"}}]},
            {"content": "diagnostic: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="call the tool and tell me what happened")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def the_audited_call(run: Run, tool: str = "echo") -> AuditEvent:
    """The last audited attempt of the call (the gate audits every attempt; all of them failed alike)."""
    events = list(AuditEvent.objects.filter(run_id=run.id, tool=tool).order_by("id"))
    assert events, f"no audit event for {tool}"
    assert len({(e.ok, e.reason) for e in events}) == 1, [(e.attempt, e.ok, e.reason) for e in events]
    return events[-1]


def tool_message(run: Run, tool: str = "echo") -> str:
    [message] = [m for m in run.messages if m["type"] == "tool" and m["name"] == tool]
    return str(message["content"])


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def children() -> set[int]:
    return set(McpSessionPool.child_process_ids())


def assert_no_process_left_behind(before: set[int]) -> None:
    assert wait_for(lambda: not (children() - before)), f"server processes left behind: {children() - before}"


def assert_a_failure_value(run: Run, *, reason: str, says: str, tool: str = "echo") -> None:
    """The run ended normally with the gate's diagnostic as the answer, and the call was audited as failed."""
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert run.answer.startswith("diagnostic: ")
    assert says.lower() in run.answer.lower(), run.answer
    assert says.lower() in tool_message(run, tool).lower()
    event = the_audited_call(run, tool)
    assert (event.source, event.ok, event.reason) == ("agent", False, reason), (event.ok, event.reason, event.result)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture
def before() -> set[int]:
    """The server processes that were alive before the test (other tests' shared sessions)."""
    return children()


@pytest.fixture
def short_initialize_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lower the pool's 30 s floor on opening a session to ``INITIALIZE_DEADLINE_S``, and the SDK's 2 s grace for a
    server to end once its stdin is closed (a server hung in ``initialize`` never reads it: it is then terminated,
    as before, only sooner) to ``TERMINATION_GRACE_S``; everything else is real."""
    monkeypatch.setattr(pool_module, "PROCESS_TERMINATION_TIMEOUT", TERMINATION_GRACE_S)
    original = McpSessionPool._with_session

    async def capped(self: McpSessionPool, connection: Any, operation: Any, **kwargs: Any) -> Any:
        kwargs["open_timeout_s"] = min(kwargs["open_timeout_s"], INITIALIZE_DEADLINE_S)
        return await original(self, connection, operation, **kwargs)

    monkeypatch.setattr(McpSessionPool, "_with_session", capped)


@pytest.fixture
def status_server() -> Iterator[Callable[[int], str]]:
    """Starts, per call, a tiny HTTP server on 127.0.0.1 that answers every request with one status; gives its
    URL. All of them are stopped at the end of the test."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: int) -> str:
        class AlwaysStatus(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"error": f"status {status}"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AlwaysStatus)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name=f"status-{status}", daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/mcp"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# ---- a server that fails to start -------------------------------------------------------------------------------
LAST_WORDS = "fatal: config file /etc/probe.toml missing"
CANNOT_START = {
    "exits-at-once": {"args": [script_file(f"import sys; sys.stderr.write({LAST_WORDS!r} + '\\n'); sys.exit(3)")]},
    "no-such-command": {"command": "/nonexistent/bin/mcp-server", "args": []},
}


def cannot_start_binding(mcp_id: str, case: str) -> McpServer:
    server = stdio_binding(mcp_id)
    McpServer.objects.filter(pk=server.pk).update(**CANNOT_START[case])
    server.refresh_from_db()
    return server


@pytest.mark.parametrize("case", CANNOT_START)
def test_a_server_that_cannot_start_is_a_health_error_that_says_so(case: str, before: set[int]) -> None:
    server = discovered(cannot_start_binding(f"cannot-start-{case}", case))
    assert server.health == McpServer.Health.ERROR
    assert server.last_error.startswith(f"server 'cannot-start-{case}' could not be started: ")
    if case == "no-such-command":
        assert "No such file or directory: '/nonexistent/bin/mcp-server'" in server.last_error
    assert server.last_checked_at is not None
    assert not server.tools.exists()
    assert_no_process_left_behind(before)


def test_the_health_error_of_a_server_that_cannot_start_quotes_its_last_words_even_when_stderr_is_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forward = _StderrPipe._forward

    def late_forward(self: _StderrPipe) -> None:
        time.sleep(0.3)
        forward(self)

    monkeypatch.setattr(_StderrPipe, "_forward", late_forward)
    server = discovered(cannot_start_binding("cannot-start-late-stderr", "exits-at-once"))
    assert server.health == McpServer.Health.ERROR
    assert LAST_WORDS in server.last_error


@pytest.mark.parametrize("case", CANNOT_START)
def test_a_run_calling_a_server_that_cannot_start_gets_a_transport_failure(case: str, before: set[int]) -> None:
    server = cannot_start_binding(f"run-cannot-start-{case}", case)
    record_tool(server)
    run = run_calling(server)
    # The pool's detail is written in the run's language, the agent's (Korean): "could not be started".
    assert_a_failure_value(run, reason="transport", says="시작할 수 없음")
    assert_no_process_left_behind(before)


# ---- a server that exits mid-call -------------------------------------------------------------------------------
def test_a_server_that_exits_while_listing_its_tools_is_a_health_error(before: set[int]) -> None:
    server = discovered(stdio_binding("exits-listing", PROBE_MODE="exit_on_list"))
    assert server.health == McpServer.Health.ERROR
    assert "broke" in server.last_error
    assert "connection closed" in server.last_error.lower()
    assert not server.tools.exists()
    assert_no_process_left_behind(before)


@pytest.mark.slow
def test_a_server_that_exits_mid_call_is_a_transport_failure_in_the_run(before: set[int]) -> None:
    # Listing works (the process only dies inside tools/call), so discovery itself is healthy.
    server = discovered(stdio_binding("exits-mid-call", PROBE_MODE="exit_on_call"))
    assert server.health == McpServer.Health.OK, server.last_error
    assert server.tools.filter(name="echo").exists()
    run = run_calling(server)
    # The pool never re-sends a call that went out; the gate's retries do, each one audited, and each process dies.
    assert_a_failure_value(run, reason="transport", says="connection closed")
    assert "'exits-mid-call' 세션이 끊어졌습니다" in run.answer  # the pool's words, in the run's language
    assert_no_process_left_behind(before)


# ---- a server that writes garbage to stdout ---------------------------------------------------------------------
def test_a_few_garbage_lines_before_the_protocol_are_tolerated(before: set[int]) -> None:
    """Non-protocol lines on stdout (a stray banner, a debug print) are skipped: the server still works, and the
    run's own session and process end with the run."""
    server = discovered(stdio_binding("garbage-then-mcp", PROBE_MODE="garbage"))
    assert server.health == McpServer.Health.OK, server.last_error
    run = run_calling(server)
    assert run.status == Run.Status.SUCCEEDED
    assert run.answer == "diagnostic: " + tool_data_block("hello")
    event = the_audited_call(run)
    assert (event.ok, event.reason) == (True, "")
    assert_no_process_left_behind(before)


def test_a_command_that_prints_garbage_and_exits_is_a_health_error(before: set[int]) -> None:
    server = discovered(stdio_binding("garbage-and-exit", PROBE_MODE="garbage_exit"))
    assert server.health == McpServer.Health.ERROR
    assert "could not be started" in server.last_error
    assert not server.tools.exists()
    assert_no_process_left_behind(before)


def test_the_health_error_of_a_command_that_speaks_no_mcp_quotes_what_it_wrote(before: set[int]) -> None:
    server = discovered(stdio_binding("garbage-and-exit-words", PROBE_MODE="garbage_exit"))
    assert server.health == McpServer.Health.ERROR
    assert "usage: probe" in server.last_error


def test_a_run_calling_a_command_that_prints_garbage_and_exits_gets_a_transport_failure(before: set[int]) -> None:
    server = stdio_binding("run-garbage-and-exit", PROBE_MODE="garbage_exit")
    record_tool(server)
    run = run_calling(server)
    # The pool's detail is written in the run's language, the agent's (Korean): "could not be started".
    assert_a_failure_value(run, reason="transport", says="시작할 수 없음")
    assert_no_process_left_behind(before)


def test_a_program_that_keeps_answering_garbage_is_a_health_error(
    short_initialize_deadline: None, before: set[int]
) -> None:
    # It never answers initialize, so this is the hang's timeout path (a run gets the same "timeout" failure).
    server = discovered(stdio_binding("garbage-only", PROBE_MODE="garbage_only"))
    assert server.health == McpServer.Health.ERROR
    assert f"did not initialize within {INITIALIZE_DEADLINE_S:g}s" in server.last_error
    assert_no_process_left_behind(before)


# ---- a server that hangs in initialize --------------------------------------------------------------------------
def test_a_server_that_hangs_in_initialize_is_a_health_error(short_initialize_deadline: None, before: set[int]) -> None:
    server = discovered(stdio_binding("hangs-in-init", PROBE_MODE="hang_init"))
    assert server.health == McpServer.Health.ERROR
    assert server.last_error == f"server 'hangs-in-init' did not initialize within {INITIALIZE_DEADLINE_S:g}s"
    assert_no_process_left_behind(before)


@pytest.mark.slow
def test_a_run_calling_a_server_that_hangs_in_initialize_gets_a_timeout_failure(
    short_initialize_deadline: None, before: set[int]
) -> None:
    server = stdio_binding("run-hangs-in-init", PROBE_MODE="hang_init")
    record_tool(server)
    started = time.monotonic()
    run = run_calling(server)
    assert time.monotonic() - started < 20
    # "did not initialize within 0.5s", in the run's language (the agent's: Korean), as the pool wrote it.
    assert_a_failure_value(run, reason="timeout", says=f"{INITIALIZE_DEADLINE_S:g}초 안에 초기화되지 않음")
    assert "제한 시간 내에 응답하지 않음" in run.answer  # "did not answer in time", in the agent's language
    assert_no_process_left_behind(before)


# ---- a tool with a malformed input schema ------------------------------------------------------------------------
# The platform's behaviour chosen here: discovery records every listed tool (the admin must see what the server
# offers) but a tool whose inputSchema is not a JSON-schema object is flagged: the binding's health is "error" and
# names the tool, and the tool is not callable (never offered to a model: a tool spec such as {"type": "string"}
# makes Bedrock reject every request of every agent bound to the server). The server's other tools stay usable.
# A call to the flagged tool is refused by the gate, audited, and the run goes on.
MALFORMED = ["not_object", "bad_properties"]


@pytest.mark.parametrize("schema_mode", MALFORMED)
def test_a_tool_with_a_malformed_input_schema_is_flagged_at_discovery(schema_mode: str, before: set[int]) -> None:
    server = discovered(stdio_binding(f"schema-{schema_mode}", module=MALFORMED_SCHEMA_SERVER, SCHEMA_MODE=schema_mode))
    assert server.health == McpServer.Health.ERROR
    assert "broken" in server.last_error
    assert "input schema" in server.last_error.lower()
    broken = server.tools.get(name="broken")
    assert not broken.callable
    assert server.tools.get(name="echo").callable
    assert_no_process_left_behind(before)


@pytest.mark.parametrize("schema_mode", MALFORMED)
def test_a_run_calling_a_tool_with_a_malformed_schema_gets_an_audited_failure(schema_mode: str) -> None:
    server = discovered(
        stdio_binding(f"run-schema-{schema_mode}", module=MALFORMED_SCHEMA_SERVER, SCHEMA_MODE=schema_mode)
    )
    run = run_calling(server, tool="broken", args={"text": "x"})
    assert run.status == Run.Status.SUCCEEDED
    assert "broken" in run.answer
    event = the_audited_call(run, "broken")
    assert event.ok is False
    assert event.reason


@pytest.mark.parametrize("schema_mode", MALFORMED)
def test_a_malformed_tool_schema_never_crashes_a_run_and_the_good_tools_still_answer(
    schema_mode: str, before: set[int]
) -> None:
    server = discovered(
        stdio_binding(f"good-beside-{schema_mode}", module=MALFORMED_SCHEMA_SERVER, SCHEMA_MODE=schema_mode)
    )
    assert server.tools.filter(name="broken").exists()  # recorded either way, for the admin to see
    run = run_calling(server, tool="echo", args={"text": "still here"})
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert run.answer == "diagnostic: " + tool_data_block("still here")
    assert the_audited_call(run).ok is True
    assert_no_process_left_behind(before)


# ---- an HTTP server that is down, or answers 401 / 500 ---------------------------------------------------------
HTTP_TRANSPORTS = [McpServer.Transport.STREAMABLE_HTTP, McpServer.Transport.SSE]


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
def test_an_http_server_that_is_down_is_a_health_error(transport: str, before: set[int]) -> None:
    server = discovered(http_binding(f"down-{transport}", f"http://127.0.0.1:{free_port()}/mcp", transport=transport))
    assert server.health == McpServer.Health.ERROR
    assert "could not be" in server.last_error
    assert "connection attempts failed" in server.last_error.lower()
    assert_no_process_left_behind(before)


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
def test_a_run_calling_an_http_server_that_is_down_gets_a_transport_failure(transport: str, before: set[int]) -> None:
    server = http_binding(f"run-down-{transport}", f"http://127.0.0.1:{free_port()}/mcp", transport=transport)
    record_tool(server)
    run = run_calling(server)
    assert_a_failure_value(run, reason="transport", says="connection attempts failed")
    assert_no_process_left_behind(before)


STATUSES = {401: "Unauthorized", 500: "Internal Server Error"}


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
@pytest.mark.parametrize("status", STATUSES)
def test_an_http_server_answering_an_error_status_is_a_health_error_naming_it(
    status: int, transport: str, status_server: Callable[[int], str], before: set[int]
) -> None:
    server = discovered(
        http_binding(
            f"status-{status}-{transport}",
            status_server(status),
            transport=transport,
            headers={"Authorization": SECRET_TOKEN},
        )
    )
    assert server.health == McpServer.Health.ERROR
    assert f"{status} {STATUSES[status]}" in server.last_error
    assert SECRET_TOKEN not in server.last_error
    assert_no_process_left_behind(before)


@pytest.mark.parametrize("transport", HTTP_TRANSPORTS)
@pytest.mark.parametrize("status", STATUSES)
def test_a_run_calling_an_http_server_answering_an_error_status_gets_a_transport_failure(
    status: int, transport: str, status_server: Callable[[int], str], before: set[int]
) -> None:
    server = http_binding(
        f"run-status-{status}-{transport}",
        status_server(status),
        transport=transport,
        headers={"Authorization": SECRET_TOKEN},
    )
    record_tool(server)
    run = run_calling(server)
    assert_a_failure_value(run, reason="transport", says=f"{status} {STATUSES[status]}")
    stored = json.dumps(list(AuditEvent.objects.filter(run_id=run.id).values()), default=str) + run.answer
    assert SECRET_TOKEN not in stored
    assert_no_process_left_behind(before)
