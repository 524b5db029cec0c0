"""The REST API's runs views and its event stream, as a reviewer found them: the list read every JSON column of
each run; ``page_size`` was validated by one rule and applied by another; repeated headers and query parameters
were merged or silently dropped; the idempotency digest covered the body's bytes, not the run; ``?wait`` errors
echoed the value; the event stream answered HEAD/OPTIONS, its throttling and too many parameters unlike the rest,
a database error mid-stream cut it off without a word, and a client gone before the first chunk held its slot."""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import Any

import pytest
from django.core.signals import request_finished
from django.db import DatabaseError, OperationalError, close_old_connections, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agents.config_cache import shown_secrets
from agents.models import Agent, AgentVersion, Run, RunEvent
from agents.services import agent_version_publish

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def events_url(run: Run) -> str:
    return f"{URL}/{run.pk}/events"


@pytest.fixture
def key(api_caller: Any) -> Any:
    return api_caller[0]


# --- GET /runs reads only the columns it shows ---------------------------------------------------------------


@pytest.mark.slow
def test_the_list_reads_only_the_summarys_columns_and_no_more_queries_per_run(
    api_client: APIClient, demo_agent: Agent, key: Any
) -> None:
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", note="v1")
    version = AgentVersion.objects.get(agent=demo_agent)
    big = [{"blob": "x" * 20_000}]

    def listed(count: int) -> tuple[dict[str, Any], list[str]]:
        for _ in range(count):
            Run.objects.create(
                agent=demo_agent,
                version=version,
                api_key=key,
                query="q",
                context={"userId": "u"},
                a2a_data=big,
                messages=big,
                conversation=big,
                deterministic_results=big,
                status=Run.Status.FAILED,
                error_code="e",
                error_message="m",
            )
        with CaptureQueriesContext(connection) as queries:
            response = api_client.get(f"{URL}?page_size=20")
        assert response.status_code == 200
        return response.json(), [q["sql"] for q in queries.captured_queries]

    listed(0)  # the key's first request of the test writes its last use once
    shown_secrets()  # what a listed run is masked with, read once per configuration change (held by the process)
    _one, one_sql = listed(1)
    many, many_sql = listed(4)
    assert len(many["results"]) == 5
    assert len(many_sql) == len(one_sql)  # no query per listed run
    summary = many["results"][0]
    assert (summary["agent"], summary["version"], summary["error"]) == (
        demo_agent.slug,
        version.number,
        {"code": "e", "message": "m"},
    )
    quote = connection.ops.quote_name
    unread = [
        f"{quote(Run._meta.db_table)}.{quote(name)}"
        for name in ("context", "a2a_data", "a2a_files", "messages", "conversation", "deterministic_results")
    ] + [
        f"{quote(AgentVersion._meta.db_table)}.{quote('content')}",
        f"{quote(Agent._meta.db_table)}.{quote('system_prompt')}",
    ]
    run_reads = [
        sql for sql in many_sql if quote(Run._meta.db_table) in sql and sql.lstrip().upper().startswith("SELECT")
    ]
    assert run_reads
    for sql in run_reads:
        assert not [column for column in unread if column in sql], sql


# --- page_size: the validated value is the one applied ---------------------------------------------------------


@pytest.mark.parametrize("raw", ["2.0", "%2B2", "%202", "2"])
def test_the_page_size_read_by_the_filter_is_the_one_applied(
    api_client: APIClient, demo_agent: Agent, key: Any, raw: str
) -> None:
    for _ in range(3):
        Run.objects.create(agent=demo_agent, api_key=key, query="q")
    response = api_client.get(f"{URL}?page_size={raw}")
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == 2
    assert response.json()["next"]


# --- Idempotency-Key: two headers are not one key ------------------------------------------------------------


def test_an_idempotency_key_with_a_comma_is_refused(api_client: APIClient, demo_agent: Agent) -> None:
    # Django joins two ``Idempotency-Key`` headers (dupA, dupB) with a comma: what the view reads is this.
    response = api_client.post(
        URL, {"agent": demo_agent.slug, "query": "q"}, format="json", HTTP_IDEMPOTENCY_KEY="dupA,dupB"
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_input"
    assert "Idempotency-Key" in error["fields"]
    assert "comma" in error["message"]
    assert not Run.objects.exists()


# --- the idempotency digest is of the run asked for --------------------------------------------------------------


def test_the_same_request_normalised_differently_is_replayed_not_refused(
    api_client: APIClient, demo_agent: Agent
) -> None:
    composed = unicodedata.normalize("NFC", "한국 팀")
    first = api_client.post(
        URL, {"agent": demo_agent.slug, "query": composed}, format="json", HTTP_IDEMPOTENCY_KEY="same-1"
    )
    assert first.status_code == 202, first.content
    for body in (
        {"agent": demo_agent.slug, "query": unicodedata.normalize("NFD", composed)},
        {"agent": demo_agent.slug, "query": composed, "context": {}},
        {"agent": demo_agent.slug, "query": composed + " ", "data": [], "files": []},
    ):
        again = api_client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="same-1")
        assert again.status_code == 200, (body, again.content)
        assert again["Idempotent-Replayed"] == "true"
        assert again.json()["id"] == first.json()["id"]
    other = api_client.post(
        URL, {"agent": demo_agent.slug, "query": "다른 질문"}, format="json", HTTP_IDEMPOTENCY_KEY="same-1"
    )
    assert other.status_code == 409
    assert error_of(other)["code"] == "idempotency_key_reused"
    assert Run.objects.count() == 1


# --- a query parameter given twice --------------------------------------------------------------------------------


def test_a_query_parameter_given_twice_is_refused_by_name(api_client: APIClient, demo_agent: Agent, key: Any) -> None:
    posted = api_client.post(f"{URL}?wait=5&wait=6", {"agent": demo_agent.slug, "query": "q"}, format="json")
    assert posted.status_code == 400
    assert set(error_of(posted)["fields"]) == {"wait"}
    assert not Run.objects.exists()
    listed = api_client.get(f"{URL}?agent=a&agent=b&status=queued")
    assert listed.status_code == 400
    assert set(error_of(listed)["fields"]) == {"agent"}
    assert "'agent'" in error_of(listed)["message"]
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.SUCCEEDED)
    streamed = api_client.get(f"{events_url(run)}?after=1&after=2")
    assert streamed.status_code == 400
    assert set(error_of(streamed)["fields"]) == {"after"}


def test_a_bad_after_is_refused_with_a_good_last_event_id(api_client: APIClient, demo_agent: Agent, key: Any) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.SUCCEEDED)
    response = api_client.get(f"{events_url(run)}?after=x", HTTP_LAST_EVENT_ID="3")
    assert response.status_code == 400
    assert set(error_of(response)["fields"]) == {"after"}


# --- ?wait errors say what is wanted, not the value ----------------------------------------------------------------


@pytest.mark.parametrize("raw", ["-1", "9" * 5000, "abc"])
def test_a_bad_wait_is_told_in_words_without_its_value(api_client: APIClient, demo_agent: Agent, raw: str) -> None:
    response = api_client.post(f"{URL}?wait={raw}", {"agent": demo_agent.slug, "query": "q"}, format="json")
    assert response.status_code == 400
    error = error_of(response)
    assert error["fields"]["wait"] == ["A number of seconds from 0 to 60, such as 5 or 0.5."]
    assert raw not in response.content.decode()


# --- the event stream answers as the REST views do -----------------------------------------------------------------


def test_the_event_stream_answers_head_and_options(
    api_client: APIClient, demo_agent: Agent, key: Any, settings: Any
) -> None:
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.SUCCEEDED)
    head = api_client.head(events_url(run))
    assert head.status_code == 200
    assert head["Content-Type"].startswith("text/event-stream")
    assert head.content == b""
    options = api_client.options(events_url(run))
    assert options.status_code == 200
    assert set(options["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    assert options.json()["description"].startswith("Described in the OpenAPI schema")
    # HEAD opened no stream: the key's one slot is free.
    stream = api_client.get(events_url(run))
    assert stream.status_code == 200
    b"".join(stream.streaming_content)
    refused = api_client.put(events_url(run))
    assert refused.status_code == 405
    assert set(refused["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    assert Client().head(events_url(run)).status_code == 401


def test_the_event_streams_refusals_are_worded_as_the_rest_views(
    api_client: APIClient, demo_agent: Agent, key: Any
) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.SUCCEEDED)
    rest_405 = error_of(api_client.post(f"{URL}/{run.pk}", HTTP_ACCEPT_LANGUAGE="ko"))["message"]
    stream_405 = error_of(api_client.post(events_url(run), HTTP_ACCEPT_LANGUAGE="ko"))["message"]
    assert stream_405 == rest_405
    key.rate = "1/min"
    key.save(update_fields=["rate"])
    api_client.get(f"{URL}/{run.pk}")  # the minute's one request
    rest_429 = api_client.get(f"{URL}/{run.pk}", HTTP_ACCEPT_LANGUAGE="ko")
    stream_429 = api_client.get(events_url(run), HTTP_ACCEPT_LANGUAGE="ko")
    assert (rest_429.status_code, stream_429.status_code) == (429, 429)

    def words(response: Any) -> str:
        return re.sub(r"\d+", "N", error_of(response)["message"])

    assert words(stream_429) == words(rest_429)


def test_too_many_parameters_on_the_stream_is_a_400_not_a_security_error(
    api_client: APIClient, demo_agent: Agent, key: Any, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.SUCCEEDED)
    query = "&".join(f"p{i}=1" for i in range(1100))
    with caplog.at_level(logging.WARNING):
        response = api_client.get(f"{events_url(run)}?{query}")
    assert response.status_code == 400
    assert error_of(response)["code"] == "too_many_fields"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# --- the stream under a failing database, and a client gone before its first chunk ---------------------------------


@pytest.mark.parametrize(
    ("failure", "code"),
    [(OperationalError("database is locked"), "unavailable"), (DatabaseError("no such column"), "server_error")],
)
def test_a_database_error_mid_stream_ends_it_with_an_error_event(
    api_client: APIClient, demo_agent: Agent, key: Any, failure: Exception, code: str
) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.RUNNING)
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running"})
    response = api_client.get(events_url(run))
    assert response.status_code == 200
    chunks = iter(response.streaming_content)
    assert next(chunks).startswith(b"retry:")

    def fail(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        raise failure

    with connection.execute_wrapper(fail):
        rest = b"".join(chunks).decode()
    assert rest.startswith("event: error\n"), rest
    assert f'"code": "{code}"' in rest


def test_a_stream_closed_before_its_first_chunk_frees_its_slot(
    api_client: APIClient, demo_agent: Agent, key: Any, settings: Any
) -> None:
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.RUNNING)
    first = api_client.get(events_url(run))
    assert first.status_code == 200
    closed(first)  # the client went away: the server closes the response, never having read from it
    second = api_client.get(events_url(run))
    assert second.status_code == 200, second.content
    closed(second)


def closed(response: Any) -> None:
    """Close ``response`` as a server does, the test database kept open (as the test client keeps it when it
    closes a response itself: ``request_finished`` would close the connection)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)
