"""The pool's sessions read a tool's output schema after its answer, never within the call's deadline; every page
of the tools list is read for it, once per session.

The SDK reads the tools list for a tool whose output schema it does not know yet (every run's own session, a worker's
session: discovery ran in another process) inside ``call_tool``: a list slower than the tool's timeout turned an
answered call into ``McpTimeoutError(sent=True)`` (a read sent again, a write of unknown outcome), and a tool listed
past the first page cost a ``tools/list`` on every call and was never checked. A hand-written stdio server
(``tests/mcp_fixtures/slow_listing_server.py``) answers calls at once and lists slowly, or in pages.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from audit.models import AuditEvent
from mcpregistry import client_session, gate
from mcpregistry import pool as pool_module
from mcpregistry.client_session import ToolResultInvalid
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpSessionPool, get_default_pool, shutdown_default_pool
from mcpregistry.services import tool_contract_update
from tests.conftest import discover_as_admin


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def slow_listing(log: Path, **env: str) -> dict[str, Any]:
    return {
        "mcp_id": "slow-listing",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.slow_listing_server"],
        "cwd": str(settings.BASE_DIR),
        "env": {"LOG": str(log), **env},
    }


def seen(log: Path) -> list[str]:
    """What the server was sent (and when it answered a list), in order."""
    return log.read_text(encoding="utf-8").splitlines()


def wait_for_list_answered(log: Path) -> None:
    """Until the server has answered its tools list (it writes so once its answer is out)."""
    for _ in range(200):
        if "answered tools/list" in seen(log):
            return
        time.sleep(0.05)
    raise AssertionError("the server never answered its tools list")


@pytest.mark.slow
def test_a_call_answered_while_the_tools_list_is_slow_returns_its_answer_and_is_sent_once(
    pool: McpSessionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_session, "OUTPUT_SCHEMA_WAIT_S", 0.1, raising=False)  # the list takes longer than this
    log = tmp_path / "log"
    config = slow_listing(log, LIST_DELAY="1")

    answered = pool.call_tool(config, "report", {}, timeout_s=0.5)  # was McpTimeoutError(sent=True)

    assert (answered.is_error, answered.structured) == (False, {"done": True})
    assert seen(log).count("tools/call") == 1


def test_a_list_that_came_late_still_checks_the_later_answers_and_is_read_once(
    pool: McpSessionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_session, "OUTPUT_SCHEMA_WAIT_S", 0.1, raising=False)
    log = tmp_path / "log"
    config = slow_listing(log, LIST_DELAY="0.5")

    first = pool.call_tool(config, "report", {"bad": True}, timeout_s=5)  # the list not read yet: unchecked
    wait_for_list_answered(log)
    with pytest.raises(ToolResultInvalid, match="Invalid structured content returned by tool report"):
        pool.call_tool(config, "report", {"bad": True}, timeout_s=5)
    good = pool.call_tool(config, "report", {}, timeout_s=5)

    assert first.structured == {"done": "no"} and good.structured == {"done": True}
    assert seen(log).count("tools/list") == 1 and seen(log).count("tools/call") == 3


def test_a_tool_on_the_second_page_of_the_list_is_checked_and_the_list_is_read_once(
    pool: McpSessionPool, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    config = slow_listing(log, PAGED="1")

    good = pool.call_tool(config, "report", {}, timeout_s=5)
    with pytest.raises(ToolResultInvalid, match="Invalid structured content returned by tool report"):
        pool.call_tool(config, "report", {"bad": True}, timeout_s=5)  # was taken unchecked
    unlisted = [pool.call_tool(config, "unlisted", {}, timeout_s=5) for _ in range(2)]  # a tool listed nowhere

    assert good.structured == {"done": True} and all(not outcome.is_error for outcome in unlisted)
    # Two pages, once: not a first page again on every call (that was 4 lists, of the first page only).
    assert seen(log).count("tools/list") == 2 and seen(log).count("tools/call") == 4


def bound_server(mcp_id: str, module: str, *, timeout_s: float | None = None, **env: str) -> McpServer:
    """``module``'s server bound and discovered, its tools read-only with ``timeout_s``, retried on a timeout (as a
    read may be)."""
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", module],
        cwd=str(settings.BASE_DIR),
        env=env,  # type: ignore[misc]
        public_env=list(env),  # the fixture's settings, not secrets
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    for contract in ToolContract.objects.filter(tool__server=server):
        retry = {"max_attempts": 3, "on": ["timeout", "transport"]}
        data = {"risk": "read", "retry": retry, "timeout_s": timeout_s}
        tool_contract_update(contract=contract, actor="test-admin", via="tests", data=data)
    return McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)


@pytest.mark.slow
@pytest.mark.django_db
def test_through_the_gate_a_read_answered_while_the_list_is_slow_succeeds_at_its_first_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_session, "OUTPUT_SCHEMA_WAIT_S", 0.1, raising=False)
    log, delay = tmp_path / "log", tmp_path / "delay"
    server = bound_server(
        "slow-listing",
        "tests.mcp_fixtures.slow_listing_server",
        timeout_s=0.5,
        LOG=str(log),
        LIST_DELAY_FILE=str(delay),
    )
    shutdown_default_pool()  # as a worker's pool: the discovery ran in another process
    delay.write_text("1", encoding="utf-8")
    log.write_text("", encoding="utf-8")
    try:
        result = gate.call(server=server, tool_name="report", args={}, who=gate.GateCall(source="admin"))
    finally:
        get_default_pool().close("slow-listing")

    # Was: a timeout at each of its 3 sends, every one of them answered.
    assert (result.ok, result.error, result.attempts, result.value) == (True, None, 1, {"done": True})
    assert seen(log).count("tools/call") == 1


def huge_answer(log: Path, **env: str) -> dict[str, Any]:
    return {
        "mcp_id": "huge-answer",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.huge_answer_server"],
        "cwd": str(settings.BASE_DIR),
        "env": {"LOG": str(log), **env},
    }


@pytest.mark.parametrize("id_last", ["0", "1"])
def test_an_answer_longer_than_the_pool_reads_is_refused_unread_and_its_session_goes_on(
    pool: McpSessionPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, id_last: str
) -> None:
    monkeypatch.setattr(pool_module, "STDIO_LINE_MAX_BYTES", 1024 * 1024, raising=False)  # 1 MiB: a quick test
    log = tmp_path / "log"
    config = huge_answer(log, ID_LAST=id_last)

    whole = pool.call_tool(config, "echo_chars", {"chars": 300_000}, timeout_s=10)  # 900 kB: read whole
    with pytest.raises(ToolResultInvalid, match="bytes long, more than the 1048576 bytes read; refused unread"):
        pool.call_tool(config, "echo_chars", {"chars": 400_000}, timeout_s=10)  # 1.2 MB: was read whole
    after = pool.call_tool(config, "echo_chars", {"chars": 3}, timeout_s=10)

    assert whole.text == "가" * 300_000 and after.text == "가가가"
    # Each call sent once, over one session (one server process): the long line was skipped, nothing else lost.
    assert seen(log).count("tools/call") == 3 and seen(log).count("initialize") == 1


@pytest.mark.django_db
def test_through_the_gate_an_answer_too_long_to_read_fails_as_its_answer_at_its_first_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "STDIO_LINE_MAX_BYTES", 1024 * 1024, raising=False)
    log = tmp_path / "log"
    server = bound_server("huge-answer", "tests.mcp_fixtures.huge_answer_server", LOG=str(log))
    try:
        result = gate.call(
            server=server, tool_name="echo_chars", args={"chars": 400_000}, who=gate.GateCall(source="admin")
        )
    finally:
        get_default_pool().close("huge-answer")

    # The tool answered: its answer too big, refused unread by the pool (never a timeout or a transport error),
    # sent once.
    assert (result.ok, result.attempts, result.error) == (False, 1, "result:too_big")
    (event,) = AuditEvent.objects.filter(action="tool.call", tool="echo_chars")
    assert event.reason == "result:too_big" and seen(log).count("tools/call") == 1
    assert "refused unread" in str(event.result)


def test_an_answer_that_is_no_utf8_fails_its_call_at_once_and_the_session_goes_on(
    pool: McpSessionPool, tmp_path: Path
) -> None:
    """Decoded before it was parsed, the line's error held no line: its request waited for its whole timeout and
    was taken for unanswered (retried; a write's outcome unknown) though the server answered."""
    log = tmp_path / "log"
    config = huge_answer(log)

    with pytest.raises(ToolResultInvalid, match="the server's answer could not be read"):
        pool.call_tool(config, "echo_chars", {"not_utf8": True}, timeout_s=30)
    after = pool.call_tool(config, "echo_chars", {"chars": 2}, timeout_s=10)

    assert after.text == "가가"
    assert seen(log).count("tools/call") == 2 and seen(log).count("initialize") == 1
