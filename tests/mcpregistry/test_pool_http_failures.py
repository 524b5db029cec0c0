"""HTTP answers that go wrong on the way fail their request at once, as what they are, never as a timeout
(``tests.mcp_fixtures.hostile_answers_server``).

1. Streamable HTTP with plain JSON answers: the SDK parses such an answer from bytes, and hands its parse error, or
   the read error of a body cut by a dropped connection, to the session's message handler only. The request waited
   for its whole timeout and failed as ``McpTimeoutError``: a read was sent again, an approved write answered in
   milliseconds ended ``outcome_unknown``. Now an answer nested too deep, not JSON or not UTF-8 fails at once as
   unreadable (``ToolResultInvalid``: the gate's ``result:shape``), and a body cut short fails at once as a
   transport error of a request that went out (``sent=True``: a write is not sent again).
2. SSE: a POST the server refused (403, 500) was logged by the SDK, and the request waited for its whole timeout.
   Now it fails at once as a transport error naming the status (never the URL, whose query may hold a key), with
   ``sent=True``; the next call goes out on a fresh session.
3. The pool's own sentences for a timeout and a broken session are gettext sentences, in the caller's language.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.utils import translation
from django.utils.translation import trans_real

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Run
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry.client_session import ToolResultInvalid
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpSessionPool, McpTimeoutError, McpTransportError
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.hostile_answers_server import HostileAnswers, serving

# Long enough that a request left to its deadline fails these tests as a timeout, not as what it should have been.
CALL_TIMEOUT_S = 5.0
URL_SECRET = "k3y-7f1c0a9e2b"

PROVISIONAL_KOREAN = {
    "no answer from '%(server)s' within %(seconds)ss": "'%(server)s'에서 %(seconds)s초 안에 응답 없음",
    "session to '%(server)s' broke: %(error)s": "'%(server)s' 세션이 끊어짐: %(error)s",
}


@pytest.fixture
def endpoint() -> Iterator[HostileAnswers]:
    with serving() as state:
        yield state


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


@pytest.fixture
def korean_pool_messages() -> Iterator[None]:
    """A provisional Korean text of each sentence the shipped catalogue does not translate yet (removed afterwards):
    the tests compare with the catalogue's text, whichever it is."""
    catalogue = trans_real.translation("ko")._catalog  # type: ignore[attr-defined]
    added = [msgid for msgid in PROVISIONAL_KOREAN if msgid not in catalogue]
    for msgid in added:
        catalogue[msgid] = PROVISIONAL_KOREAN[msgid]
    yield
    for msgid in added:
        del catalogue._catalogs[0][msgid]


def in_korean(msgid: str, **params: str) -> str:
    with translation.override("ko"):
        return translation.gettext(msgid) % params


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()


def http_config(endpoint: HostileAnswers) -> dict[str, Any]:
    return {"mcp_id": "answers-http", "transport": "streamable_http", "url": endpoint.url("/mcp"), "headers": {}}


def sse_config(endpoint: HostileAnswers) -> dict[str, Any]:
    return {"mcp_id": "answers-sse", "transport": "sse", "url": endpoint.url(f"/sse?key={URL_SECRET}"), "headers": {}}


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("deep", "recursion limit exceeded"),
        ("invalid_json", "EOF while parsing"),
        ("not_utf8", "invalid unicode code point"),
    ],
)
def test_an_http_json_answer_that_cannot_be_read_fails_its_call_as_unreadable(
    endpoint: HostileAnswers, pool: McpSessionPool, tool: str, why: str
) -> None:
    config = http_config(endpoint)

    with pytest.raises(ToolResultInvalid) as unreadable:
        pool.call_tool(config, tool, {}, timeout_s=CALL_TIMEOUT_S)

    assert f"the server's answer could not be read: Invalid JSON: {why}" in str(unreadable.value)
    assert endpoint.calls_of(tool) == 1
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"  # the session still serves


def test_an_http_answer_cut_by_a_dropped_connection_is_a_transport_error_of_a_sent_request(
    endpoint: HostileAnswers, pool: McpSessionPool
) -> None:
    config = http_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"

    with pytest.raises(McpTransportError) as lost:
        pool.call_tool(config, "cut_body", {}, timeout_s=CALL_TIMEOUT_S)

    assert lost.value.sent is True  # it reached the server: its outcome is unknown, for the gate to decide
    assert str(lost.value).startswith("session to 'answers-http' broke: RemoteProtocolError: ")
    assert "complete message body" in str(lost.value)
    assert endpoint.calls_of("cut_body") == 1  # never sent again by the pool
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"


def test_a_call_in_flight_beside_a_cut_answer_keeps_its_own_answer(
    endpoint: HostileAnswers, pool: McpSessionPool
) -> None:
    """Only the request whose answer was lost fails: the session is retired, not closed under its other calls."""
    config = http_config(endpoint)
    with ThreadPoolExecutor(max_workers=1) as executor:
        hanging = executor.submit(pool.call_tool, config, "hang", {}, timeout_s=CALL_TIMEOUT_S)
        assert wait_for(lambda: endpoint.calls_of("hang") == 1)

        with pytest.raises(McpTransportError):
            pool.call_tool(config, "cut_body", {}, timeout_s=CALL_TIMEOUT_S)
        endpoint.release.set()

        assert hanging.result().text == "fine"
    assert endpoint.calls_of("hang") == 1


@pytest.mark.parametrize(("tool", "status"), [("refused_403", "HTTP 403 Forbidden"), ("refused_500", "HTTP 500")])
def test_an_sse_post_the_server_refuses_is_a_transport_error_naming_the_status(
    endpoint: HostileAnswers, pool: McpSessionPool, tool: str, status: str
) -> None:
    config = sse_config(endpoint)
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"

    with pytest.raises(McpTransportError) as refused:
        pool.call_tool(config, tool, {}, timeout_s=CALL_TIMEOUT_S)

    assert refused.value.sent is True
    assert str(refused.value).startswith(f"session to 'answers-sse' broke: {status}")
    assert URL_SECRET not in str(refused.value) and "/messages" not in str(refused.value)
    assert endpoint.calls_of(tool) == 1
    # The SDK sends nothing more on that session: the next call goes out on a fresh one.
    assert pool.call_tool(config, "ok", {}, timeout_s=CALL_TIMEOUT_S).text == "fine"
    assert endpoint.calls_of("ok") == 2


@pytest.mark.slow
def test_the_pool_says_a_timeout_in_the_caller_s_language(
    endpoint: HostileAnswers, pool: McpSessionPool, korean_pool_messages: None
) -> None:
    with translation.override("ko"), pytest.raises(McpTimeoutError) as timed_out:
        pool.call_tool(http_config(endpoint), "hang", {}, timeout_s=0.5)

    said = in_korean("no answer from '%(server)s' within %(seconds)ss", server="answers-http", seconds="0.5")
    assert str(timed_out.value) == said
    assert "no answer" not in said


def test_the_pool_says_a_broken_session_in_the_caller_s_language(
    endpoint: HostileAnswers, pool: McpSessionPool, korean_pool_messages: None
) -> None:
    with translation.override("ko"), pytest.raises(McpTransportError) as refused:
        pool.call_tool(sse_config(endpoint), "refused_403", {}, timeout_s=CALL_TIMEOUT_S)

    said = in_korean("session to '%(server)s' broke: %(error)s", server="answers-sse", error="HTTP 403 Forbidden")
    assert str(refused.value) == said
    assert "broke" not in said


# ---- through the gate: a write is sent once, its outcome said for what it is ----------------------------------
def approved_write_run(endpoint: HostileAnswers, tool: str) -> Run:
    """A run whose (scripted) model calls the write ``tool`` once, approved, then answers with what it gave back."""
    server = McpServer.objects.create(
        mcp_id="answers-write",
        name="answers-write",
        transport=McpServer.Transport.STREAMABLE_HTTP,
        url=endpoint.url("/mcp"),
        timeout_s=CALL_TIMEOUT_S,
        session_scope=McpServer.SessionScope.PER_RUN,
    )
    assert discover_as_admin(server=server).ok
    assert ToolContract.objects.get(tool__server=server, tool__name=tool).risk == "write"
    key, _raw = api_key_create(actor="test-admin", via="tests", name="writer")
    agent = make_agent(
        slug="answers-writer",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": tool, "args": {}}]}, {"content": "diagnostic: {last_tool_result}"}],
    )
    run = Run.objects.create(agent=agent, api_key=key, query="do it")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == "awaiting_approval"
    approval_decide(run=run, approval_id=str(run.approvals.get().pk), decision="approve", actor="test-admin")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_an_approved_write_whose_answer_was_cut_is_sent_once_and_its_outcome_unknown(endpoint: HostileAnswers) -> None:
    run = approved_write_run(endpoint, "cut_body")

    assert endpoint.calls_of("cut_body") == 1
    assert run.approvals.get().status == "outcome_unknown"
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason) == (False, "transport")


@pytest.mark.django_db
def test_an_approved_write_answered_unreadably_is_sent_once_and_said_carried_out(endpoint: HostileAnswers) -> None:
    run = approved_write_run(endpoint, "deep")

    assert endpoint.calls_of("deep") == 1
    assert run.approvals.get().status == "executed"
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason) == (False, "result:shape")
