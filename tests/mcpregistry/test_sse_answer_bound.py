"""An SSE server's answers are read to the bound a stdio line and a streamable HTTP answer are read to: over SSE
they come on the session's one event stream, and an event longer than the bound ends that stream (the call fails,
as a transport error) instead of being read whole into the worker's memory. A shorter answer is read as before."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mcpregistry.pool as pool_module
from mcpregistry import gate
from mcpregistry.client_session import ToolResultTooBig
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpSessionPool, get_default_pool
from tests.conftest import discover_as_admin

SERVER = Path(__file__).resolve().parents[1] / "mcp_fixtures" / "long_answer_server.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def sse_url() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "sse", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/sse"
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_an_sse_event_longer_than_the_bound_is_not_read_whole(sse_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "STDIO_LINE_MAX_BYTES", 100_000)
    pool = McpSessionPool()
    config = {"mcp_id": "long-sse", "transport": "sse", "url": sse_url, "headers": {}}
    try:
        assert pool.call_tool(config, "answer", {"n": 1_000}, timeout_s=20).text == "가" * 1_000
        with pytest.raises(ToolResultTooBig):  # the call it answers, named by the event's head: not a transport error
            pool.call_tool(config, "answer", {"n": 200_000}, timeout_s=20)  # 600 kB of UTF-8
        # A fresh session answers again.
        assert pool.call_tool(config, "answer", {"n": 10}, timeout_s=20).text == "가" * 10
    finally:
        pool.shutdown()


@pytest.mark.slow
@pytest.mark.django_db
def test_through_the_gate_an_sse_answer_too_long_is_result_too_big_once_and_opens_no_circuit(
    sse_url: str, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.PLATFORM_MCP_ALLOW_PRIVATE_URLS = ["127.0.0.1"]
    monkeypatch.setattr(pool_module, "STDIO_LINE_MAX_BYTES", 100_000)
    server = McpServer.objects.create(mcp_id="long-sse", name="long", transport="sse", url=sse_url, timeout_s=20)
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read", memo=False)
    try:
        for i in range(3):
            result = gate.call(
                server=McpServer.objects.get(pk=server.pk),
                tool_name="answer",
                args={"n": 200_000 + i},
                who=gate.GateCall(source="agent", call_id=f"c{i}"),
            )
            assert (result.error, result.attempts) == ("result:too_big", 1)
        stored = McpServer.objects.get(pk=server.pk)
        assert (stored.breaker_state, stored.breaker_failures) == ("closed", 0)
        small = gate.call(server=stored, tool_name="answer", args={"n": 5}, who=gate.GateCall(source="agent"))
        assert small.ok and small.value == "가" * 5
    finally:
        get_default_pool().close("long-sse")


def test_only_the_head_s_first_bytes_are_read_for_the_answer_s_id() -> None:
    """Reading an id restarts at each escaped quote of a string the cut leaves open (its time grows with the square
    of what it reads: 64 KiB of quoted JSON held the pool's loop for 18 s), so only the first
    ``ANSWER_ID_HEAD_BYTES`` are read; servers write the id before the result."""
    quoted = json.dumps([{"id": i, "q": "x"} for i in range(5000)])
    first = json.dumps({"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": quoted}]}})
    assert pool_module._event_answer_id(("event: message\ndata: " + first).encode()[:65536]) == 5
    late = '{"jsonrpc": "2.0", "result": {"pad": "' + "a" * pool_module.ANSWER_ID_HEAD_BYTES + '"}, "id": 6}'
    assert pool_module._event_answer_id(("data: " + late).encode()) is None
