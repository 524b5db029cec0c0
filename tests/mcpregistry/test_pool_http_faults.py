"""The session pool against a streamable-HTTP endpoint that misbehaves (``tests.mcp_fixtures.hostile_http_server``).

Two defects are held here:

1. A call that timed out left its HTTP request open (the SDK keeps reading the answer; a server's keep-alive
   comments keep resetting the read timeout) and the session was kept. After 100 of them (httpx's connection
   pool) every call on the session timed out, a healthy tool's included, and a call that never got a connection
   came back as a timeout with ``sent=True``. Now the session is retired at the timeout: the next call opens a
   fresh one, and the old one is closed (its stuck requests with it) once its last call in flight ends; such a
   call keeps its own answer, or its own timeout with ``sent=True``, and nothing is sent again.
2. An answer with the wrong content type (``200 text/html`` from a login proxy) was kept as protocol noise: the
   initialize or call waited for its whole deadline, and the message said "not MCP on stdout". Now the session
   fails at once (a transport error; ``sent=True`` for a call), worded "unexpected HTTP content type: text/html".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from mcpregistry.pool import McpSessionPool, McpTimeoutError, McpTransportError
from tests.mcp_fixtures.hostile_http_server import HostileHttp, serving


@pytest.fixture
def endpoint() -> Iterator[HostileHttp]:
    with serving() as state:
        yield state


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def http_config(endpoint: HostileHttp, path: str = "/mcp") -> dict[str, Any]:
    return {"mcp_id": "hostile-http", "transport": "streamable_http", "url": endpoint.url(path), "headers": {}}


def wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_timed_out_call_closes_its_http_stream_and_the_next_call_goes_out_on_a_fresh_session(
    endpoint: HostileHttp, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=10).text == "fine"
    [first_session] = endpoint.sessions_of("ok")

    with pytest.raises(McpTimeoutError) as timed_out:
        pool.call_tool(config, "stream_forever", {}, timeout_s=0.3)
    assert timed_out.value.sent is True  # it went out: its outcome is unknown, for the gate to decide

    # The session is closed: its stuck request with it, the server told (the cancellation, then the session's end).
    assert wait_for(lambda: endpoint.open_streams == 0), "the timed-out call's HTTP stream is still open"
    assert wait_for(lambda: first_session in endpoint.deleted)
    assert len(endpoint.cancelled) == 1
    assert pool.call_tool(config, "ok", {}, timeout_s=10).text == "fine"
    assert endpoint.sessions_of("ok")[1] != first_session
    assert endpoint.calls_of("stream_forever") == 1  # never sent again
    assert len(pool.live_sessions()) == 1


@pytest.mark.slow
def test_a_call_in_flight_on_a_retired_session_keeps_its_answer_and_its_own_timeout_and_is_sent_once(
    endpoint: HostileHttp, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=10).text == "fine"
    [first_session] = endpoint.sessions_of("ok")
    with ThreadPoolExecutor(2) as threads:
        answered = threads.submit(pool.call_tool, config, "slow", {"s": 1.5}, timeout_s=10)
        unanswered = threads.submit(pool.call_tool, config, "stream_forever", {}, timeout_s=1.0)
        assert wait_for(lambda: endpoint.calls_of("slow") == 1 and endpoint.open_streams == 1)
        with pytest.raises(McpTimeoutError):
            pool.call_tool(config, "stream_forever", {}, timeout_s=0.2)  # retires the session

        # A new call goes out on a fresh session at once, while the old one still carries two calls.
        assert pool.call_tool(config, "ok", {}, timeout_s=10).text == "fine"
        assert endpoint.sessions_of("ok")[1] != first_session
        assert first_session not in endpoint.deleted

        assert answered.result().text == "done"  # not cut off by the retirement
        with pytest.raises(McpTimeoutError) as timed_out:
            unanswered.result()
        assert timed_out.value.sent is True
    assert endpoint.sessions_of("slow") == [first_session]  # each sent once, on the session it began on
    assert endpoint.sessions_of("stream_forever") == [first_session, first_session]
    # The retired session is closed once its last call ended: every stuck stream with it.
    assert wait_for(lambda: first_session in endpoint.deleted and endpoint.open_streams == 0)
    assert len(pool.live_sessions()) == 1


@pytest.mark.slow
def test_a_hundred_timed_out_calls_leave_a_healthy_tool_answering(endpoint: HostileHttp, pool: McpSessionPool) -> None:
    """The reviewer's reproduction: past httpx's 100 connections every call on the session timed out. The 105 calls
    come from five callers at once (a worker's threads), each waiting out its own 0.2 s: a fifth of the time of one
    after another, and as many stuck streams on a session kept after a timeout (the defect) as before."""
    config = http_config(endpoint)

    def times_out(_: int) -> bool:
        with pytest.raises(McpTimeoutError):
            pool.call_tool(config, "stream_forever", {}, timeout_s=0.2)
        return True

    with ThreadPoolExecutor(5) as callers:
        assert all(callers.map(times_out, range(105)))
    began = time.monotonic()
    assert pool.call_tool(config, "ok", {}, timeout_s=10).text == "fine"
    assert time.monotonic() - began < 5
    assert endpoint.calls_of("stream_forever") == 105
    assert wait_for(lambda: endpoint.open_streams == 0)


def test_an_html_answer_to_initialize_fails_at_once_and_says_so_for_http(
    endpoint: HostileHttp, pool: McpSessionPool
) -> None:
    began = time.monotonic()
    with pytest.raises(McpTransportError) as failed:
        pool.list_tools(http_config(endpoint, "/login"), timeout_s=5)
    assert time.monotonic() - began < 3
    assert failed.value.sent is False  # nothing was called
    assert str(failed.value) == (
        "server 'hostile-http' did not answer as an MCP server: unexpected HTTP content type: text/html"
    )
    assert pool.live_sessions() == {}


def test_an_html_answer_to_a_call_fails_the_call_at_once_as_a_broken_session(
    endpoint: HostileHttp, pool: McpSessionPool
) -> None:
    config = http_config(endpoint, "/html-on-call")
    assert [t["name"] for t in pool.list_tools(config, timeout_s=10).tools] == ["ok", "slow", "stream_forever"]
    began = time.monotonic()
    with pytest.raises(McpTransportError) as failed:
        pool.call_tool(config, "ok", {}, timeout_s=4)
    assert time.monotonic() - began < 3
    assert failed.value.sent is True  # the request went out: its outcome is unknown
    assert "unexpected HTTP content type: text/html" in str(failed.value)
    assert "stdout" not in str(failed.value)
    assert pool.live_sessions() == {}
    # The next request opens a fresh session.
    assert len(pool.list_tools(config, timeout_s=10).tools) == 3
