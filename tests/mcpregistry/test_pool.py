"""The session pool against the real demo server over stdio: reuse, scopes, concurrency, crashes, idling."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings

from mcpregistry.pool import McpSessionPool, McpTransportError
from tests.mcp_fixtures.scripts import script_file

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = pytest.mark.slow


def demo_config(mcp_id: str = "demo", **env: str) -> dict:
    return {
        "mcp_id": mcp_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
        "cwd": str(settings.BASE_DIR),
        "env": {"FAILURE_MODE": "none", **env},
    }


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_calls_reuse_one_live_session_and_one_server_process(pool: McpSessionPool) -> None:
    before = set(pool.child_process_ids())
    for _ in range(20):
        assert pool.call_tool(demo_config(), "ping", {}, timeout_s=10).text == "pong"
    started = set(pool.child_process_ids()) - before
    assert len(started) == 1
    assert len(pool.live_sessions()) == 1


def test_the_negotiated_protocol_and_server_info_are_known(pool: McpSessionPool) -> None:
    listing = pool.list_tools(demo_config(), timeout_s=30)
    assert listing.protocol_version
    assert listing.server_info["name"] == "sds-company-data"
    assert {t["name"] for t in listing.tools} >= {"search_employee", "list_team_members", "get_asset", "list_projects"}


def test_a_scoped_session_is_separate_and_closed_with_its_scope(pool: McpSessionPool) -> None:
    before = set(pool.child_process_ids())
    pool.call_tool(demo_config(), "ping", {}, timeout_s=10)
    pool.call_tool(demo_config(), "ping", {}, timeout_s=10, scope="run:1")
    pool.call_tool(demo_config(), "ping", {}, timeout_s=10, scope="run:1")
    assert len(set(pool.child_process_ids()) - before) == 2
    pool.close_scope("run:2")  # a scope without a session: nothing closes
    pool.close_scope("run:")
    assert len(pool.live_sessions()) == 2
    pool.close_scope("run:1")
    assert wait_for(lambda: len(set(pool.child_process_ids()) - before) == 1)
    assert len(pool.live_sessions()) == 1


def test_concurrent_calls_share_the_session_safely(pool: McpSessionPool) -> None:
    before = set(pool.child_process_ids())
    names = ["김하늘", "박도윤", "이서준", "최민준", "정하은"] * 8
    with ThreadPoolExecutor(max_workers=8) as executor:
        results = list(
            executor.map(lambda n: pool.call_tool(demo_config(), "search_employee", {"name": n}, timeout_s=20), names)
        )
    assert all(not r.is_error and name in r.text for r, name in zip(results, names, strict=True))
    assert len(set(pool.child_process_ids()) - before) == 1


def test_a_server_that_died_is_replaced_once_transparently(pool: McpSessionPool) -> None:
    before = set(pool.child_process_ids())
    pool.call_tool(demo_config(), "ping", {}, timeout_s=10)
    [first] = set(pool.child_process_ids()) - before
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: first not in pool.child_process_ids())
    # Once the pool has read the end of the server's stream, it sends nothing on that session and opens a fresh
    # one. (A call racing the death itself may have been written before it: that one is not re-sent, see
    # test_at_most_once.)
    assert wait_for(lambda: pool.server_ended("demo"))
    assert pool.call_tool(demo_config(), "ping", {}, timeout_s=10).text == "pong"
    [second] = set(pool.child_process_ids()) - before
    assert second != first


def test_idle_sessions_are_closed(pool: McpSessionPool) -> None:
    idle_pool = McpSessionPool(idle_close_s=0.2)
    try:
        before = set(idle_pool.child_process_ids())
        idle_pool.call_tool(demo_config(), "ping", {}, timeout_s=10)
        assert len(set(idle_pool.child_process_ids()) - before) == 1
        assert wait_for(lambda: not (set(idle_pool.child_process_ids()) - before), timeout=15)
        assert idle_pool.live_sessions() == {}
    finally:
        idle_pool.shutdown()


def test_shutdown_leaves_no_server_process_behind() -> None:
    pool = McpSessionPool()
    before = set(pool.child_process_ids())
    pool.call_tool(demo_config("a"), "ping", {}, timeout_s=10)
    pool.call_tool(demo_config("b"), "ping", {}, timeout_s=10, scope="run:x")
    assert len(set(pool.child_process_ids()) - before) == 2
    pool.shutdown()
    assert wait_for(lambda: not (set(pool.child_process_ids()) - before))


def test_a_changed_binding_gets_a_new_session_and_the_old_one_closes(pool: McpSessionPool) -> None:
    before = set(pool.child_process_ids())
    pool.call_tool(demo_config(), "ping", {}, timeout_s=10)
    pool.call_tool(demo_config(FAILURE_MODE="rate_limit"), "ping", {}, timeout_s=10)
    assert wait_for(lambda: len(set(pool.child_process_ids()) - before) == 1)


def test_a_server_that_cannot_start_is_a_transport_error(pool: McpSessionPool) -> None:
    config = demo_config() | {"command": sys.executable, "args": [script_file("import sys; sys.exit(3)")]}
    with pytest.raises(McpTransportError):
        pool.call_tool(config, "ping", {}, timeout_s=5)
    assert pool.live_sessions() == {}


def test_the_server_gets_only_its_own_env_and_a_safe_minimum(pool: McpSessionPool, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://user:hunter2@db/platform")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    config = demo_config("env-probe") | {
        "args": ["-m", "tests.mcp_fixtures.probe_server"],
        "env": {"BINDING_VALUE": "mine"},
    }
    result = pool.call_tool(config, "environment_names", {}, timeout_s=10)
    names = set(result.text.split(","))
    assert "BINDING_VALUE" in names
    assert "PATH" in names
    assert not names & {"DATABASE_URL", "AWS_SECRET_ACCESS_KEY", "SECRETS_ENCRYPTION_KEYS", "DJANGO_SETTINGS_MODULE"}
