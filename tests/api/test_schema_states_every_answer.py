"""The served OpenAPI schema and the REST API agree (a reviewer's second comparison). Defects held here:

1. the event stream sent ``event: approval_answer``, an A2A answer's bookkeeping (the answering key's database id,
   the message's digests), which no document names; no stream or events listing sends it now, and it stays
   stored for the check that a resent answer decides nothing;
2. ``503 unavailable`` (the database down, a deadlock, a serialization failure; with ``Retry-After``) was in no
   operation's schema, and the event stream answered a 500 where the REST views answer it;
3. the body limit's ``400 bad_request`` (a NUL in the path or query) and ``413 body_too_large`` (a ``GET`` with a
   body over the limit too) were undocumented on the ``GET`` operations;
4. the 409s left out codes: ``run_finished`` on an approval's decision, ``run_busy`` on a cancel;
5. ``RunCreateRequest`` accepted bodies the server refuses (neither or both of ``query`` and ``message``);
6. under ``Accept-Language: ko`` the schema came half in Korean (titles and enum labels read from the models),
   half in English; it is served in English only.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from agents.api.a2a_server import ANSWER_EVENT
from agents.models import Agent, Approval, Run, RunEvent
from agents.selectors import BOOKKEEPING_EVENT_KINDS, run_events_after
from tests.api.test_a2a_answers_and_parts import parked, pending, send
from tests.api.test_events_stream import parse_stream
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

SCHEMA = "/api/v1/schema/?format=json"
EVENTS = "/api/v1/runs/{run_id}/events"
OPERATIONS = (
    ("/api/v1/runs", "get"),
    ("/api/v1/runs", "post"),
    ("/api/v1/runs/{run_id}", "get"),
    ("/api/v1/runs/{run_id}/cancel", "post"),
    ("/api/v1/runs/{run_id}/approvals/{approval_id}", "post"),
    ("/api/v1/runs/{run_id}/feedback", "post"),
    ("/api/v1/usage", "get"),
    (EVENTS, "get"),
)
ERROR_REF = {"$ref": "#/components/schemas/Error"}


@pytest.fixture
def schema() -> dict[str, Any]:
    response = APIClient().get(SCHEMA)
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def key_client(caller: ApiCaller) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")


# --- 1. the answer's bookkeeping event is never sent ---------------------------------------------------------


def test_an_a2a_answers_bookkeeping_event_is_stored_and_never_streamed(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run = parked(demo_agent, api_caller)
    approval = pending(run, "rule:1", "회의록")
    message = {"messageId": "m-1", "role": "ROLE_USER", "taskId": str(run.pk), "parts": [{"text": "approve"}]}
    assert "error" not in send(api_caller, message)
    stored = RunEvent.objects.get(run=run, kind=ANSWER_EVENT)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, finished_at=timezone.now())

    response = key_client(api_caller).get(EVENTS.format(run_id=run.pk))
    assert response.status_code == 200, response.content
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    events, _ = parse_stream(text)
    assert ANSWER_EVENT not in {e.event for e in events}, text
    assert "caller_id" not in text and "message_sha256" not in text, text
    assert events[-1].event == "end"

    # Resuming just before it skips it too; every stream reads the same selector (REST, A2A, MCP, the admin's).
    assert run_events_after(run_id=run.pk, after=stored.seq - 1) == list(
        RunEvent.objects.filter(run=run, seq__gt=stored.seq).order_by("seq")
    )

    # Still stored: the same answer resent decides nothing, another under its messageId is refused.
    approval.refresh_from_db()
    decided_at = approval.decided_at
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL, finished_at=None)
    assert "error" not in send(api_caller, message)
    approval.refresh_from_db()
    assert (approval.status, approval.decided_at) == (Approval.Status.APPROVED, decided_at)


def test_the_kind_left_out_of_the_streams_is_the_one_the_a2a_endpoint_writes() -> None:
    assert ANSWER_EVENT in BOOKKEEPING_EVENT_KINDS


# --- 2. and 3. the statuses every operation answers -----------------------------------------------------------


@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_every_operation_documents_the_503_with_retry_after_and_the_body_limits_400_and_413(
    schema: dict[str, Any], path: str, method: str
) -> None:
    responses = schema["paths"][path][method]["responses"]
    for status in ("400", "413", "503"):
        assert responses[status]["content"]["application/json"]["schema"] == ERROR_REF, (path, method, status)
    assert "unavailable" in responses["503"]["description"]
    assert responses["503"]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    assert responses["503"]["headers"]["Retry-After"]["required"] is True
    assert "bad_request" in responses["400"]["description"]
    assert "body_too_large" in responses["413"]["description"]


def test_the_event_stream_answers_a_database_outage_with_a_503_not_a_500(
    api_caller: ApiCaller, demo_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = parked(demo_agent, api_caller)

    def unreachable(**_: Any) -> Run:
        raise OperationalError("connection refused")

    monkeypatch.setattr("agents.api.events.run_get", unreachable)
    response = key_client(api_caller).get(EVENTS.format(run_id=run.pk))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"
    assert int(response["Retry-After"]) > 0
    assert "connection refused" not in response.content.decode()


@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/runs", "/api/v1/runs/{run_id}", EVENTS])
def test_a_get_with_a_body_over_the_limit_or_a_nul_in_its_query_is_refused_as_documented(
    api_caller: ApiCaller, demo_agent: Agent, path: str
) -> None:
    url = path.format(run_id=parked(demo_agent, api_caller).pk)
    client = key_client(api_caller)
    too_large = client.generic("GET", url, b"{}", content_type="application/json", CONTENT_LENGTH=str(10**9))
    assert (too_large.status_code, too_large.json()["error"]["code"]) == (413, "body_too_large")
    nul = client.get(url + "?agent=%00")
    assert (nul.status_code, nul.json()["error"]["code"]) == (400, "bad_request")


# --- 4. the 409s name every code ------------------------------------------------------------------------------


def test_the_409s_name_every_code_they_answer(schema: dict[str, Any]) -> None:
    decide = schema["paths"]["/api/v1/runs/{run_id}/approvals/{approval_id}"]["post"]["responses"]["409"]
    for code in ("approval_decided", "approval_expired", "run_finished"):
        assert f"`{code}`" in decide["description"], code
    cancel = schema["paths"]["/api/v1/runs/{run_id}/cancel"]["post"]["responses"]["409"]
    for code in ("run_finished", "run_busy"):
        assert f"`{code}`" in cancel["description"], code


# --- 5. a submission is query or message, as the server takes it ---------------------------------------------


def run_create_validator(schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    """The request body's schema as JSON Schema (OpenAPI 3.0's schema objects are draft 4's, plus ``nullable``
    and ``discriminator``, which none of these bodies needs)."""
    document = {"components": schema["components"], "$ref": "#/components/schemas/RunCreateRequest"}
    return jsonschema.Draft4Validator(document)


def test_the_schema_takes_exactly_one_of_query_and_message_and_still_its_examples(
    schema: dict[str, Any], api_caller: ApiCaller, demo_agent: Agent
) -> None:
    validate_schema(schema)  # type: ignore[no-untyped-call]
    validator = run_create_validator(schema)
    post = schema["paths"]["/api/v1/runs"]["post"]
    examples = post["requestBody"]["content"]["application/json"]["examples"]
    assert examples
    for name, example in examples.items():
        assert not list(validator.iter_errors(example["value"])), name

    message = {"role": "user", "parts": [{"kind": "text", "text": "주문 상태를 알려주세요"}]}
    refused = [
        {"agent": demo_agent.slug},
        {"agent": demo_agent.slug, "query": "질문", "message": message},
    ]
    client = key_client(api_caller)
    for body in refused:
        assert list(validator.iter_errors(body)), body
        response = client.post("/api/v1/runs", json.dumps(body), content_type="application/json")
        assert response.status_code == 400, (body, response.content)
    for body in ({"agent": demo_agent.slug, "query": "질문"}, {"agent": demo_agent.slug, "message": message}):
        assert not list(validator.iter_errors(body)), body


# --- 6. one language: English ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "headers"), [(SCHEMA, {"HTTP_ACCEPT_LANGUAGE": "ko"}), (SCHEMA + "&lang=ko", {})])
def test_the_schema_is_served_in_english_whatever_language_is_asked(
    schema: dict[str, Any], url: str, headers: dict[str, Any]
) -> None:
    response = APIClient().get(url, **headers)
    assert response.status_code == 200
    assert response["Content-Language"] == "en"
    assert response.json() == schema
    run = schema["components"]["schemas"]["Run"]["properties"]
    assert run["created_at"]["title"] == "Created"
    assert "* `queued` - queued" in schema["components"]["schemas"]["RunStatusEnum"]["description"]


def test_the_docs_page_still_loads_for_a_korean_reader() -> None:
    response = APIClient().get("/api/v1/docs/", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200
    assert "/api/v1/schema/" in response.content.decode()
    yaml = APIClient().get("/api/v1/schema/", HTTP_ACCEPT_LANGUAGE="ko")
    assert yaml.status_code == 200 and yaml.content.startswith(b"openapi: 3.")
