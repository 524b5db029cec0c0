"""Two defects a reviewer confirmed, and the cap on backoff waits.

1. An HTTP 429 Too Many Requests from a streamable HTTP (or SSE) server was taken for a broken transport: the whole
   session ended, the gate said ``transport`` ("the server could not be reached"), retried sooner than the server's
   ``Retry-After`` on the short transport backoff, and an approved write ended ``outcome_unknown``. Now the pool
   raises ``McpRateLimited`` (``sent=False``, the ``Retry-After`` in seconds, from seconds or an HTTP date), the
   session goes on, and the gate reads it as ``rate_limit``: a read is retried after the server's wait, an approved
   write without an idempotency key is sent once and ends executed with the rate limit as its result (known not
   done). The server is real: ``tests/mcp_fixtures/rate_limited_http_server.py`` answers 429 on purpose.
2. A tool whose schema requires its idempotency argument, named as the contract's ``idempotency_arg``: the model was
   offered ``"required": [..., "idempotency_key"]`` and a call without it was refused ``args:missing``; the gate
   fills it in after its checks, so it is neither offered (``schema_with_contract``) nor checked (``check_args``).
3. ``backoff_delay``'s jitter took a wait past ``backoff_cap_s`` (10 s against the 8 s the contract's summary shows).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Run
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.contracts import (
    DEFAULT_RETRY,
    argument_constraints,
    backoff_delay,
    check_args,
    gate_filled_argument,
    schema_with_contract,
)
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpRateLimited, McpSessionPool, get_default_pool, retry_after_seconds
from mcpregistry.services import tool_contract_update
from tests.conftest import FakeClock, discover_as_admin, make_agent
from tests.mcp_fixtures.rate_limited_http_server import TOOLS, RateLimited, serving

CALL_TIMEOUT_S = 5.0
URL_SECRET = "k3y-5e1d2c"


@pytest.fixture
def endpoint() -> Iterator[RateLimited]:
    with serving() as state:
        yield state


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


def http_config(endpoint: RateLimited) -> dict[str, Any]:
    return {"mcp_id": "limited-http", "transport": "streamable_http", "url": endpoint.url("/mcp"), "headers": {}}


def sse_config(endpoint: RateLimited) -> dict[str, Any]:
    return {"mcp_id": "limited-sse", "transport": "sse", "url": endpoint.url(f"/sse?key={URL_SECRET}"), "headers": {}}


# ---- the pool: a 429 refuses one request, with the server's wait ----------------------------------------------------
def test_an_http_429_fails_its_call_as_rate_limited_and_the_session_goes_on(
    endpoint: RateLimited, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    endpoint.refuse("lookup", 1)

    with pytest.raises(McpRateLimited) as limited:
        pool.call_tool(config, "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S)

    assert limited.value.sent is False  # refused: not carried out
    assert limited.value.retry_after_s == 3.0
    assert str(limited.value) == (
        "server 'limited-http' refused the request as rate limited: HTTP 429 Too Many Requests from "
        f"{endpoint.url('/mcp')}; retry after 3 s"
    )
    assert pool.call_tool(config, "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S).text == "lookup: done"
    first, second = endpoint.sessions_of("lookup")
    assert first == second  # the same session: a 429 did not end it


def test_a_retry_after_given_as_an_http_date_counts_from_the_answer_s_own_date(
    endpoint: RateLimited, pool: McpSessionPool
) -> None:
    endpoint.refuse("lookup", 1)
    endpoint.retry_after = "date+5"

    with pytest.raises(McpRateLimited) as limited:
        pool.call_tool(http_config(endpoint), "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S)

    assert limited.value.retry_after_s == 5.0


def test_a_429_without_retry_after_says_no_wait(endpoint: RateLimited, pool: McpSessionPool) -> None:
    endpoint.refuse("lookup", 1)
    endpoint.retry_after = ""

    with pytest.raises(McpRateLimited) as limited:
        pool.call_tool(http_config(endpoint), "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S)

    assert limited.value.retry_after_s is None
    assert str(limited.value).endswith("HTTP 429 Too Many Requests from " + endpoint.url("/mcp"))


def test_a_session_whose_opening_is_refused_with_429_is_rate_limited(
    endpoint: RateLimited, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    endpoint.refuse("initialize", 1)

    with pytest.raises(McpRateLimited) as limited:
        pool.call_tool(config, "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S)

    assert (limited.value.sent, limited.value.retry_after_s) == (False, 3.0)
    assert endpoint.calls_of("lookup") == []  # nothing was sent
    assert pool.call_tool(config, "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S).text == "lookup: done"


def test_an_sse_post_refused_with_429_is_rate_limited_never_naming_the_url(
    endpoint: RateLimited, pool: McpSessionPool
) -> None:
    config = sse_config(endpoint)
    endpoint.refuse("lookup", 1)

    with pytest.raises(McpRateLimited) as limited:
        pool.call_tool(config, "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S)

    assert (limited.value.sent, limited.value.retry_after_s) == (False, 3.0)
    assert str(limited.value) == (
        "server 'limited-sse' refused the request as rate limited: HTTP 429 Too Many Requests; retry after 3 s"
    )
    # The SDK's SSE client sends nothing more on that session: the next call goes out on a fresh one.
    assert pool.call_tool(config, "lookup", {"key": "a"}, timeout_s=CALL_TIMEOUT_S).text == "lookup: done"
    first, second = endpoint.sessions_of("lookup")
    assert first != second


def answer(**headers: str) -> httpx.Response:
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return httpx.Response(429, headers=named, request=httpx.Request("POST", "http://mcp.example/mcp"))


def test_retry_after_reads_seconds_and_http_dates_and_nothing_else() -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after_seconds(answer(retry_after="120")) == 120.0
    assert retry_after_seconds(answer(retry_after="Wed, 21 Oct 2015 07:30:30 GMT", date=date)) == 150.0
    assert retry_after_seconds(answer(retry_after="Wed, 21 Oct 2015 07:27:00 GMT", date=date)) == 0.0  # past
    assert retry_after_seconds(answer(retry_after=date)) == 0.0  # no Date: from now, long after it
    assert retry_after_seconds(answer(retry_after=" 1.5 ")) == 1.5
    for unreadable in ("soon", "-5", "1.5e3", ""):
        assert retry_after_seconds(answer(retry_after=unreadable)) is None
    assert retry_after_seconds(answer()) is None


# ---- the gate: a rate limit, retried after the server's wait; a write sent once, known not done ------------------
def limited_server(endpoint: RateLimited, mcp_id: str = "limited") -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        transport=McpServer.Transport.STREAMABLE_HTTP,
        url=endpoint.url("/mcp"),
        timeout_s=CALL_TIMEOUT_S,
        session_scope=McpServer.SessionScope.SHARED,
    )
    assert discover_as_admin(server=server).ok
    return server


def set_contract(server: McpServer, tool: str, **data: Any) -> None:
    contract = ToolContract.objects.get(tool__server=server, tool__name=tool)
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data=data)


@pytest.mark.django_db
def test_a_read_refused_with_429_is_retried_after_the_server_s_retry_after(
    endpoint: RateLimited, gate_clock: FakeClock
) -> None:
    server = limited_server(endpoint)
    set_contract(server, "lookup", risk="read")
    endpoint.refuse("lookup", 2)
    try:
        result = gate.call(server=server, tool_name="lookup", args={"key": "a"}, who=gate.GateCall(source="agent"))
    finally:
        get_default_pool().close("limited")

    assert (result.ok, result.value, result.attempts) == (True, "lookup: done", 3)
    assert gate_clock.slept == [3.0, 3.0]  # the server's wait, not the transport's 2 s backoff
    reasons = list(AuditEvent.objects.filter(tool="lookup", action="tool.call").order_by("id").values_list("reason"))
    assert reasons == [("rate_limit",), ("rate_limit",), ("",)]


@pytest.mark.django_db
def test_a_read_still_refused_tells_the_model_of_the_rate_limit(endpoint: RateLimited, gate_clock: FakeClock) -> None:
    server = limited_server(endpoint)
    set_contract(server, "lookup", risk="read")
    endpoint.refuse("lookup", 5)
    try:
        result = gate.call(server=server, tool_name="lookup", args={"key": "a"}, who=gate.GateCall(source="agent"))
    finally:
        get_default_pool().close("limited")

    assert (result.ok, result.error, result.attempts) == (False, "rate_limit", 3)
    assert "rate limit" in result.message and "could not be reached" not in result.message
    server.refresh_from_db()
    assert server.breaker_failures == 3  # counted, as any rate limit is


@pytest.mark.django_db
def test_a_read_whose_server_asks_to_wait_past_the_cap_is_not_sent_again_before_its_time(
    endpoint: RateLimited, gate_clock: FakeClock
) -> None:
    """Retry-After 30 s against a contract that waits at most 8 s: it was sent again at 8 s, and 16 s, each refused
    again (three attempts spent, three failures for the breaker). Told once, with the server's wait."""
    server = limited_server(endpoint)
    set_contract(server, "lookup", risk="read")
    endpoint.retry_after = "30"
    endpoint.refuse("lookup", 5)
    try:
        result = gate.call(server=server, tool_name="lookup", args={"key": "a"}, who=gate.GateCall(source="agent"))
    finally:
        get_default_pool().close("limited")

    assert (result.ok, result.error, result.attempts) == (False, "rate_limit", 1)
    assert gate_clock.slept == []
    assert "retry after 30 s" in result.message
    assert len(endpoint.calls_of("lookup")) == 1


@pytest.mark.django_db
def test_an_approved_write_refused_with_429_is_sent_once_and_known_not_done(
    endpoint: RateLimited, gate_clock: FakeClock
) -> None:
    server = limited_server(endpoint, mcp_id="limited-write")
    endpoint.refuse("book", 3)
    key, _raw = api_key_create(actor="test-admin", via="tests", name="booker")
    agent = make_agent(
        slug="booker",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "book", "args": {"seat": "12A", "idempotency_key": "k"}}]},
            {"content": "diagnostic: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, api_key=key, query="book 12A")
    try:
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == "awaiting_approval"
        approval_decide(run=run, approval_id=str(run.approvals.get().pk), decision="approve", actor="test-admin")
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close("limited-write")
    run.refresh_from_db()

    assert len(endpoint.calls_of("book")) == 1  # never sent again
    approval = run.approvals.get()
    assert approval.status == "executed"  # not outcome_unknown: the server refused it
    assert (approval.result or {}).get("reason") == "rate_limit"
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason) == (False, "rate_limit")
    assert gate_clock.slept == []


# ---- the idempotency argument: the gate's to fill in ---------------------------------------------------------------
BOOK_SCHEMA = TOOLS["book"]


def test_the_idempotency_argument_is_not_offered_to_the_model() -> None:
    constraints = argument_constraints(BOOK_SCHEMA)

    offered = schema_with_contract(BOOK_SCHEMA, constraints, idempotency_arg="idempotency_key")

    assert offered["properties"] == {"seat": {"type": "string"}}
    assert offered["required"] == ["seat"]
    assert schema_with_contract(BOOK_SCHEMA, {}, idempotency_arg="idempotency_key")["required"] == ["seat"]
    only_key = {
        "type": "object",
        "properties": {"idempotency_key": {"type": "string"}},
        "required": ["idempotency_key"],
    }
    assert schema_with_contract(only_key, {}, idempotency_arg="idempotency_key") == {"type": "object", "properties": {}}
    assert "idempotency_key" in schema_with_contract(BOOK_SCHEMA, constraints)["required"]  # no key named: as before


def test_the_idempotency_argument_is_neither_required_nor_checked_and_a_made_up_one_is_dropped() -> None:
    constraints = {**argument_constraints(BOOK_SCHEMA), "seat": {"required": True, "type": "str", "max_length": 3}}

    assert check_args(constraints, {"seat": "12A"}, idempotency_arg="idempotency_key") == ({"seat": "12A"}, None)
    assert check_args(constraints, {"seat": "12A", "idempotency_key": 7}, idempotency_arg="idempotency_key") == (
        {"seat": "12A"},
        None,
    )
    verdict = check_args(constraints, {"seat": "12AB"}, idempotency_arg="idempotency_key")[1]
    assert verdict is not None and verdict.reason == "args:range:seat"  # the others are checked as before
    assert check_args(constraints, {"seat": "12A"})[1].reason == "args:missing:idempotency_key"  # type: ignore[union-attr]


def test_the_argument_the_gate_fills_is_a_write_s_idempotency_argument_only() -> None:
    write = ToolContract(risk="write", idempotency_arg="idempotency_key")
    assert gate_filled_argument(write) == "idempotency_key"
    assert gate_filled_argument(ToolContract(risk="read", idempotency_arg="idempotency_key")) == ""
    assert gate_filled_argument(ToolContract(risk="write")) == ""


@pytest.mark.django_db
def test_a_write_called_without_its_required_idempotency_key_is_sent_with_the_gate_s(
    endpoint: RateLimited,
) -> None:
    server = limited_server(endpoint, mcp_id="limited-key")
    set_contract(server, "book", idempotency_arg="idempotency_key")
    key, _raw = api_key_create(actor="test-admin", via="tests", name="keyed")
    agent = make_agent(
        slug="keyed-booker",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "book", "args": {"seat": "12A"}, "id": "call_book"}]},
            {"content": "diagnostic: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, api_key=key, query="book 12A")
    try:
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == "awaiting_approval"
        approval_decide(run=run, approval_id=str(run.approvals.get().pk), decision="approve", actor="test-admin")
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close("limited-key")

    key = f"{run.id}:{run.approvals.get().pk}"  # the approval's key
    assert endpoint.calls_of("book") == [{"seat": "12A", "idempotency_key": key}]


# ---- backoff: never past the cap the contract's summary shows ------------------------------------------------------
@pytest.mark.parametrize("reason", ["rate_limit", "transport"])
def test_no_backoff_wait_is_longer_than_the_cap(reason: str) -> None:
    rng = random.Random(20240601)
    for retry in (DEFAULT_RETRY, {**DEFAULT_RETRY, "backoff_base_s": 8.0}, {**DEFAULT_RETRY, "backoff_cap_s": 5.0}):
        waits = [
            backoff_delay(reason=reason, attempt=attempt, retry=retry, retry_after_s=None, rng=rng)
            for attempt in range(1, 6)
            for _sample in range(200)
        ]
        assert max(waits) <= retry["backoff_cap_s"]
    first = [backoff_delay(reason="rate_limit", attempt=1, retry=DEFAULT_RETRY, retry_after_s=None, rng=rng)]
    assert 2.0 <= first[0] <= 2.5  # below the cap the jitter still lengthens a wait, never shortens it


# ---- a resource read refused with 429 ---------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_resource_read_refused_with_429_is_a_rate_limit_with_the_servers_wait_not_an_unreachable_server(
    endpoint: RateLimited,
) -> None:
    """A resource read is answered by the same pool: its 429 was reported as ``transport`` ("the server could not
    be reached"), counted by the breaker as such, and the model was not told to wait."""
    from tests.mcp_fixtures.rate_limited_http_server import RESOURCE

    server = McpServer.objects.create(
        mcp_id="limited-http",
        name="limited",
        transport="streamable_http",
        url=endpoint.url("/mcp"),
        timeout_s=CALL_TIMEOUT_S,
        resources=[{"uri": RESOURCE, "name": "runbook"}],
    )
    endpoint.retry_after = "7"
    endpoint.refuse("resources/read", 1)
    try:
        refused = gate.read_resource(server=server, uri=RESOURCE, who=gate.GateCall(source="admin", actor="t"))
        assert (refused.ok, refused.error) == (False, "rate_limit")
        assert "retry after 7 s" in refused.message and "could not be reached" not in refused.message
        event = AuditEvent.objects.get(action="resource.read")
        assert (event.ok, event.reason) == (False, "rate_limit")

        read = gate.read_resource(server=server, uri=RESOURCE, who=gate.GateCall(source="admin", actor="t"))
        assert (read.ok, read.value) == (True, "런북: 재시작")  # the same session goes on
    finally:
        get_default_pool().close("limited-http")
