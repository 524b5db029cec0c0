"""A session whose call timed out is retired, over stdio as over HTTP.

A FastMCP server whose tool works in a thread goes on after ``notifications/cancelled``, and its late answer to
the cancelled request ends the server (python-sdk#2416): a call sent on that session meanwhile was lost, as
``sent=True`` (a write: outcome unknown), though the server never saw it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from mcpregistry.pool import McpSessionPool, McpTimeoutError

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_fixtures" / "sync_sleep_server.py")


@pytest.mark.slow
def test_a_call_after_a_timeout_is_not_lost_to_the_late_answer_that_ends_the_server() -> None:
    pool = McpSessionPool()
    config = {"mcp_id": "stalled", "transport": "stdio", "command": sys.executable, "args": [SERVER]}
    try:
        others = set(pool.child_process_ids())  # this process's other children (another pool's servers)
        assert pool.call_tool(config, "echo", {"text": "before"}, timeout_s=20).text == "before"
        [first] = set(pool.child_process_ids()) - others
        with pytest.raises(McpTimeoutError):
            pool.call_tool(config, "stalled_backend", {"seconds": 0.5}, timeout_s=0.2)
        # The thread's late answer has come (it ended the old server), or the retired session was closed first:
        # either way the old server is gone before the next call (polled for, not waited out).
        deadline = time.monotonic() + 10
        while first in pool.child_process_ids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first not in pool.child_process_ids()
        assert pool.call_tool(config, "echo", {"text": "after"}, timeout_s=20).text == "after"
        assert first not in pool.child_process_ids()
    finally:
        pool.shutdown()
