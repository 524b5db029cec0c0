"""A stdio server's stderr cut to a length before it was masked: a line was read up to ``STDERR_LINE_MAX``
characters and kept (in the session's stderr tail, in the DEBUG log) as cut, and the failure detail an error quotes
was cut at ``FAILURE_DETAIL_MAX`` unmasked. A secret straddling either cut lost its tail, and its head matched
neither the secret's value nor any pattern: the log filter let it through, at DEBUG (``mcpregistry.server.<id>``)
and in the WARNING a worker logs when a session fails to open (``agent_platform.celery``). The same for the content
type of an HTTP answer that is not MCP, cut at 200 characters before it was masked. Each is now masked, then cut."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from audit.masking import mask_text, register_secrets
from mcpregistry.pool import (
    FAILURE_DETAIL_MAX,
    STDERR_LINE_MAX,
    McpSessionPool,
    McpTransportError,
    _unexpected_content_type,
)

TOKEN = "UpstreamKey7f3a9c2e41d8Q"
HEAD = TOKEN[:22]  # what a cut two characters before the token's end leaves
LINE_OPENING = "config: "


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def dying_config(*pads: int) -> dict[str, Any]:
    return {
        "mcp_id": "says-too-much",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.stderr_secret_server"],
        "cwd": str(settings.BASE_DIR),
        "env": {"UP_TOKEN": TOKEN, "STDERR_PADS": ",".join(str(pad) for pad in pads)},
    }


def open_failure(pool: McpSessionPool, config: dict[str, Any]) -> McpTransportError:
    register_secrets([TOKEN])  # as whoever opens a session does first (discovery, the gate, a worker's start)
    with pytest.raises(McpTransportError) as failed:
        pool.open(config, timeout_s=30)
    return failed.value


def test_a_secret_across_a_stderr_lines_cut_is_masked_whole_in_the_error_and_the_debug_log(
    pool: McpSessionPool, masked_caplog: Any
) -> None:
    pad = STDERR_LINE_MAX - len(HEAD) - len(LINE_OPENING)  # the token starts 22 characters before the line's cut
    with masked_caplog.at_level(logging.DEBUG, logger="mcpregistry.server.says-too-much"):
        error = open_failure(pool, dying_config(pad))
    logged = [r.getMessage() for r in masked_caplog.records if r.name == "mcpregistry.server.says-too-much"]
    assert logged and all(line.startswith(LINE_OPENING) for line in logged)
    assert HEAD not in "\n".join(logged) and HEAD not in masked_caplog.text
    assert "***" in logged[0] and logged[0].endswith(" end")  # masked whole, and short enough now to be kept
    assert HEAD not in str(error) and "***" in str(error)


def test_a_secret_across_the_failure_details_cut_is_masked_whole(pool: McpSessionPool) -> None:
    first = len(LINE_OPENING) + 100 + len(TOKEN) + len(" end")
    # The second line, after "; ", puts the token 22 characters before the detail's cut.
    pad = FAILURE_DETAIL_MAX - len(HEAD) - first - len("; ") - len(LINE_OPENING)
    error = open_failure(pool, dying_config(100, pad))
    assert HEAD not in mask_text(str(error))  # what anything downstream masks: the head of a secret stays
    assert HEAD not in str(error) and str(error).count("***") == 2


@pytest.mark.django_db
def test_a_server_that_dies_at_a_workers_start_logs_no_head_of_its_secret(masked_caplog: Any) -> None:
    """The reviewer's path: a worker opens its shared sessions at start and logs the failure (with the server's
    last stderr lines) at WARNING; the server's lines are logged at DEBUG."""
    from agent_platform.celery import _open_sessions_now
    from mcpregistry.models import McpServer
    from mcpregistry.pool import get_default_pool
    from tests.conftest import make_agent

    config = dying_config(STDERR_LINE_MAX - len(HEAD) - len(LINE_OPENING))
    server = McpServer.objects.create(
        mcp_id="says-too-much",
        name="says-too-much",
        command=config["command"],
        args=config["args"],
        cwd=config["cwd"],
        env=config["env"],
        public_env=["STDERR_PADS"],
        session_scope="shared",
        timeout_s=5,
    )
    make_agent(slug="says-too-much", servers=[server], with_demo_rules=False)
    try:
        with masked_caplog.at_level(logging.DEBUG):
            _open_sessions_now()
    finally:
        get_default_pool().close("says-too-much")
    assert "says-too-much: could not open a session at start" in masked_caplog.text
    assert any(r.name == "mcpregistry.server.says-too-much" for r in masked_caplog.records)
    assert HEAD not in masked_caplog.text


def test_the_content_type_of_an_answer_that_is_no_mcp_is_masked_before_it_is_cut() -> None:
    register_secrets([TOKEN])
    said = ValueError("Unexpected content type: text/html; x=" + "q" * (200 - len(HEAD) - len("text/html; x=")) + TOKEN)
    told = _unexpected_content_type(said)
    assert told is not None and HEAD not in told and len(told) <= 200
