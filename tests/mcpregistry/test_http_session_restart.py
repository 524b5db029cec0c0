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
    def __init__(self, file: Path) -> None:
        self.port, self.file = free_port(), file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_fixtures.headers_server", str(self.port), str(self.file)],
            cwd=settings.BASE_DIR,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        wait_until(listening, timeout=30, what="the HTTP MCP server")

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
