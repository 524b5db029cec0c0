"""A tool's error text is read for a status (timeout, rate limit) without the quoted words that hold the caller's
own values: an argument the tool echoes. The demo server's unknown-asset error quotes the id it was given
("'<id>' 자산을 찾을 수 없습니다. 등록된 자산: …"); with an asset_id "X timed out" or "status 429" the call was read
as a timeout or a rate limit: retried, counted by the breaker (two such runs opened the circuit for every caller of
the server) and the model sent to the backup tool. A status the tool writes outside quotes still counts, and so
does one it quotes of its own (a JSON error body's value, an upstream message): a first version that read no quoted
words at all took a write's ``{"error": "upstream timed out"}`` for a plain failure, its outcome known."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from mcpregistry.contracts import argument_texts, classify_tool_error
from mcpregistry.demo_server.server import ASSETS
from mcpregistry.pool import get_default_pool
from tests.conftest import FakeClock, bind_demo_server, make_agent

ECHOED_IDS = ["X timed out", "HTTP 504", "deadline exceeded", "status 429", "A-1 rate limited", "too many requests"]


def unknown_asset(asset_id: str) -> str:
    """The demo server's answer for an asset it does not know, as it writes it."""
    return f"'{asset_id}' 자산을 찾을 수 없습니다. 등록된 자산: {', '.join(a['asset_id'] for a in ASSETS)}"


@pytest.mark.parametrize("asset_id", ECHOED_IDS)
def test_a_status_in_an_id_the_demo_server_echoes_is_a_tool_error(asset_id: str) -> None:
    assert classify_tool_error(unknown_asset(asset_id), echoed=argument_texts({"asset_id": asset_id})) == (
        "tool:error",
        None,
    )


@pytest.mark.parametrize("asset_id", ECHOED_IDS)
def test_a_status_in_words_quoted_by_any_mark_is_a_tool_error(asset_id: str) -> None:
    echoed = argument_texts({"asset_id": asset_id})
    for opening, closing in ("''", '""', "``", "‘’", "“”", "«»", "「」", "『』"):
        assert classify_tool_error(f"no asset {opening}{asset_id}{closing} here", echoed) == ("tool:error", None)
    # A Korean particle right after the closing mark still closes it.
    assert classify_tool_error(f"'{asset_id}'를 찾을 수 없습니다", echoed) == ("tool:error", None)
    assert classify_tool_error(f"Error: asset '{asset_id}' not found", echoed) == ("tool:error", None)


def test_a_status_the_tool_writes_outside_its_quotes_still_counts() -> None:
    echoed = argument_texts({"asset_id": "A-1", "note": "X timed out"})
    assert classify_tool_error("asset 'A-1' lookup failed: HTTP 504", echoed) == ("timeout", None)
    assert classify_tool_error("'A-1': upstream status 429, Retry-After: 3", echoed) == ("rate_limit", 3.0)
    assert classify_tool_error("code: 429 for 'X timed out'", echoed) == ("rate_limit", None)
    assert classify_tool_error("\"asset 'X timed out' not found\"", echoed) == ("tool:error", None)
    assert classify_tool_error("timeout: backend did not answer") == ("timeout", None)
    assert classify_tool_error("429 rate_limit: 에러: 호출 한도를 초과했습니다.") == ("rate_limit", None)
    assert classify_tool_error("Error: request timed out after 5s") == ("timeout", None)
    assert classify_tool_error("error 504 while reading 'A-1'") == ("timeout", None)
    assert classify_tool_error('{"error": {"code": 429, "message": "X timed out"}, "Retry-After": "2"}', echoed) == (
        "rate_limit",
        2.0,
    )
    # A message quoted whole (as a JSON string) is the tool's own; what it quotes inside is not.
    assert classify_tool_error('"Too many requests, slow down"') == ("rate_limit", None)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"error": "Too Many Requests", "retry_after": 5}', "rate_limit"),
        ('{"error": {"message": "Rate limit exceeded"}}', "rate_limit"),
        ('{"detail": "upstream timed out"}', "timeout"),
        ('Request failed: {"message":"Deadline exceeded"}', "timeout"),
        ('Error executing tool: "Connection timed out"', "timeout"),
        ("error: 'deadline exceeded'", "timeout"),
        ('backend said "rate limit exceeded", retry after 3', "rate_limit"),
        ("「timed out」 으로 실패", "timeout"),
    ],
)
def test_a_status_the_tool_quotes_of_its_own_counts(text: str, reason: str) -> None:
    """A JSON error body's values and an upstream message the tool quotes are its own words: with the call's own
    values elsewhere, they are read (a write's quoted timeout is an outcome unknown, never a failure known)."""
    assert classify_tool_error(text, argument_texts({"asset_id": "A-1001", "text": "송금 1건"}))[0] == reason


def test_an_apostrophe_in_a_word_opens_no_quote_that_hides_a_status_after_it() -> None:
    assert classify_tool_error("The server's backend timed out") == ("timeout", None)
    assert classify_tool_error("The backend didn't answer: deadline exceeded") == ("timeout", None)
    assert classify_tool_error("the users' quota: rate limit exceeded") == ("rate_limit", None)
    assert classify_tool_error("Couldn't reach 'A-1', the server's backend timed out") == ("timeout", None)
    assert classify_tool_error("‘A-1’ didn’t answer: HTTP 504") == ("timeout", None)
    # A mark left open (an apostrophe opening a word) quotes nothing.
    assert classify_tool_error("it's the 'primary backend timed out") == ("timeout", None)
    # A quote ends at its line, and within 200 characters.
    assert classify_tool_error("asset 'A-1\nbackend timed out'") == ("timeout", None)
    assert classify_tool_error("'" + "x" * 200 + " timed out' 자산") == ("timeout", None)


@pytest.mark.slow
@pytest.mark.django_db
def test_an_asset_id_that_says_timed_out_is_one_attempt_and_counts_nothing_against_the_server(
    gate_clock: FakeClock,
) -> None:
    server = bind_demo_server(mcp_id="echoed-words", failure_mode="none")
    script = [
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "X timed out"}}]},
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "status 429"}}]},
        {"content": "답: {last_tool_result}"},
    ]
    agent = make_agent(slug="echoed-words", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="X timed out 자산과 status 429 자산의 상태")
    try:
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close(server.mcp_id)

    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id")
    assert [(e.tool, e.attempt, e.ok, e.reason) for e in calls] == [
        ("get_asset_status", 1, False, "tool:error"),
        ("get_asset_status", 1, False, "tool:error"),
    ]
    assert gate_clock.slept == []  # no backoff
    server.refresh_from_db()
    assert (server.breaker_state, server.breaker_failures) == ("closed", 0)
