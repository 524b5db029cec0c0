"""A stdio server's stdout lines that are not MCP (``tests.mcp_fixtures.noisy_stdout_server``).

The defect held here: the SDK's ``mcp.client.stdio`` logged one ERROR with a traceback per such line (5,000 lines,
5,000 error records), though the pool already keeps the first lines, masked, as the server's protocol noise. The
SDK's transport loggers are set to CRITICAL in ``LOGGING``. The noise keeps its stdio wording ("not MCP on
stdout"), which an HTTP server's no longer gets.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from mcpregistry.pool import McpSessionPool, McpTransportError


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def noisy_config(**env: str) -> dict[str, Any]:
    return {
        "mcp_id": "noisy",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.noisy_stdout_server"],
        "cwd": str(settings.BASE_DIR),
        "env": env,
    }


def test_lines_on_stdout_that_are_not_mcp_log_no_error_each_and_are_kept_as_noise(
    pool: McpSessionPool, caplog: pytest.LogCaptureFixture
) -> None:
    outcome = pool.call_tool(noisy_config(), "garbage_lines", {"n": 300}, timeout_s=30)
    assert outcome.text == "after garbage"
    errors = [r for r in caplog.records if r.name.startswith("mcp.") and r.levelno >= logging.ERROR]
    assert errors == []
    [pooled] = pool._sessions.values()
    assert pooled.protocol_noise == ["not json line 0", "not json line 1", "not json line 2"]


def test_the_sdk_transport_loggers_say_only_what_is_critical() -> None:
    for name in ("mcp.client.stdio", "mcp.client.streamable_http", "mcp.client.sse"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.CRITICAL, name


def test_a_program_that_is_no_mcp_server_is_told_by_what_it_wrote_on_stdout(pool: McpSessionPool) -> None:
    with pytest.raises(McpTransportError) as failed:
        pool.call_tool(noisy_config(BANNER="Usage: tool [--serve]"), "garbage_lines", {}, timeout_s=10)
    assert failed.value.sent is False
    assert "(not MCP on stdout: Usage: tool [--serve])" in str(failed.value)
