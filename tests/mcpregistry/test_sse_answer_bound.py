"""An SSE server's answers are read to the bound a stdio line and a streamable HTTP answer are read to: over SSE
they come on the session's one event stream, and an event longer than the bound ends that stream (the call fails,
as a transport error) instead of being read whole into the worker's memory. A shorter answer is read as before."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mcpregistry.pool as pool_module
from mcpregistry.client_session import ToolResultTooBig
from mcpregistry.pool import McpSessionPool, McpTransportError

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
        with pytest.raises((McpTransportError, ToolResultTooBig)):
            pool.call_tool(config, "answer", {"n": 200_000}, timeout_s=20)  # 600 kB of UTF-8
        # A fresh session answers again.
        assert pool.call_tool(config, "answer", {"n": 10}, timeout_s=20).text == "가" * 10
    finally:
        pool.shutdown()
