"""A streamable-HTTP server that restarts forgets its sessions and answers the next request on an old session
with 404 (MCP: the client must start a new session). The request was not processed, so the pool opens a fresh
session and sends it there, once: the call after a restart succeeds at its first attempt, a write included, and
is carried out once. (Before, every call failed ``protocol`` on the stale session until it went idle.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin
from tests.e2e.harness import free_port, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


class HttpServer:
    def __init__(self, file: Path, *options: str) -> None:
        self.port, self.file, self.options = free_port(), file, options
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_fixtures.headers_server", str(self.port), str(self.file), *self.options],
            cwd=settings.BASE_DIR,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        wait_until(listening, timeout=30, what="the HTTP MCP server", interval=0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path / "records.txt")
    server.start()
    yield server
    server.stop()
    get_default_pool().close("restarts")


def test_a_call_after_the_server_restarted_goes_out_once_on_a_fresh_session(http_server: HttpServer) -> None:
    binding = McpServer.objects.create(
        mcp_id="restarts",
        name="restarts",
        transport="streamable_http",
        url=f"http://127.0.0.1:{http_server.port}/mcp",
        timeout_s=10,
    )
    assert discover_as_admin(server=binding).ok
    ToolContract.objects.filter(tool__server=binding, tool__name="request_headers").update(risk="read")
    binding = McpServer.objects.prefetch_related("tools__contract").get(pk=binding.pk)
    reader = gate.GateCall(source="admin")
    assert gate.call(server=binding, tool_name="request_headers", args={}, who=reader).ok

    http_server.stop()
    http_server.start()  # the same address; none of the old sessions

    read = gate.call(server=binding, tool_name="request_headers", args={}, who=reader)
    assert (read.ok, read.error, read.attempts) == (True, None, 1)

    http_server.stop()
    http_server.start()
    writer: Any = gate.GateCall(
        source="eval", run_id=uuid.uuid4(), call_id="c1", writes_blocked=True, write_sandbox=frozenset({"restarts"})
    )
    write = gate.call(server=binding, tool_name="record", args={"text": "기록 1건"}, who=writer)
    assert (write.ok, write.attempts) == (True, 1)
    assert http_server.file.read_text(encoding="utf-8").splitlines() == ["기록 1건"]


def test_a_write_answered_on_a_session_the_server_then_forgets_is_carried_out_once_and_its_answer_stands(
    tmp_path: Path,
) -> None:
    """The SDK follows a worker session's first ``tools/call`` with a ``tools/list`` (to check the result against
    the tool's output schema). Where the server has forgotten the session by then, that second request gets the
    404: it says nothing of the call, which was answered. It used to read as the call's own 404 (a request not
    taken), so the pool sent the write again, and the gate retried it: six executions of one write."""
    server = HttpServer(tmp_path / "records.txt", "--forget-after-call")
    server.start()
    try:
        binding = McpServer.objects.create(
            mcp_id="forgets",
            name="forgets",
            transport="streamable_http",
            url=f"http://127.0.0.1:{server.port}/mcp",
            timeout_s=10,
        )
        assert discover_as_admin(server=binding).ok
        get_default_pool().close("forgets")  # as a worker's session: opened, its tools never listed
        binding = McpServer.objects.prefetch_related("tools__contract").get(pk=binding.pk)
        assert ToolContract.objects.get(tool__server=binding, tool__name="record").risk == "write"
        writer: Any = gate.GateCall(
            source="eval", run_id=uuid.uuid4(), call_id="c1", writes_blocked=True, write_sandbox=frozenset({"forgets"})
        )
        write = gate.call(server=binding, tool_name="record", args={"text": "송금 1건"}, who=writer)
        assert (write.ok, write.error, write.attempts, write.value) == (True, None, 1, "recorded")
        assert server.file.read_text(encoding="utf-8").splitlines() == ["송금 1건"]
        # The next call meets the 404 on its own request, which was not taken: sent once on a fresh session.
        second: Any = gate.GateCall(
            source="eval", run_id=uuid.uuid4(), call_id="c2", writes_blocked=True, write_sandbox=frozenset({"forgets"})
        )
        again = gate.call(server=binding, tool_name="record", args={"text": "송금 2건"}, who=second)
        assert (again.ok, again.attempts) == (True, 1)
        assert server.file.read_text(encoding="utf-8").splitlines() == ["송금 1건", "송금 2건"]
    finally:
        get_default_pool().close("forgets")
        server.stop()


def test_a_gateway_error_on_a_call_is_said_at_once_and_a_write_is_not_sent_again(tmp_path: Path) -> None:
    """An HTTP 5xx on ``tools/call`` ends the session's transport: the call waited for its whole timeout and was
    recorded as ``timeout``. It fails at once (a transport failure whose outcome is unknown: a write is not sent
    again), and the next call goes out on a fresh session."""
    import time

    server = HttpServer(tmp_path / "records.txt", "--bad-gateway-on-record")
    server.start()
    try:
        binding = McpServer.objects.create(
            mcp_id="gateway",
            name="gateway",
            transport="streamable_http",
            url=f"http://127.0.0.1:{server.port}/mcp",
            timeout_s=20,
        )
        assert discover_as_admin(server=binding).ok
        ToolContract.objects.filter(tool__server=binding, tool__name="request_headers").update(risk="read")
        binding = McpServer.objects.prefetch_related("tools__contract").get(pk=binding.pk)
        writer: Any = gate.GateCall(
            source="eval", run_id=uuid.uuid4(), call_id="c1", writes_blocked=True, write_sandbox=frozenset({"gateway"})
        )
        began = time.monotonic()
        write = gate.call(server=binding, tool_name="record", args={"text": "기록"}, who=writer)
        assert time.monotonic() - began < 10
        # Its outcome is unknown (the gateway may have passed it on): never sent again.
        assert (write.ok, write.error, write.attempts) == (False, "approval:outcome_unknown", 1)
        assert not server.file.exists()
        read = gate.call(server=binding, tool_name="request_headers", args={}, who=gate.GateCall(source="admin"))
        assert read.ok
    finally:
        server.stop()
        get_default_pool().close("gateway")
