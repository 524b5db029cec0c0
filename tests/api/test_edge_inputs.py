"""Inputs at the edges, beside the REST API's bodies (``test_hostile_requests.py``): the A2A and MCP endpoints
parse their JSON-RPC bodies as the REST API parses its own (bounded nesting, finite numbers, text a database
stores), every answer on their paths is JSON, a NUL in an API path or query is a 400 before any view, and
moments no database can compare with (a crafted cursor, an auditor's ``since=0001-01-01``) are never a 500."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client

from audit.logins import LockoutModelBackend
from tests.conftest import AUDITOR_PASSWORD, ApiCaller, make_agent

pytestmark = pytest.mark.django_db

SEND = (
    '{"jsonrpc":"2.0","id":"r1","method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m1",%s}}}'
)
DEEP = '{"a":' * 500 + "1" + "}" * 500
RPC_BODIES = {
    "nested arrays 1000 deep": "[" * 1000 + "]" * 1000,
    "a data part 500 deep": SEND % f'"parts":[{{"data":{DEEP}}}]',
    "an unpaired surrogate as the id": '{"jsonrpc":"2.0","id":"\\ud800","method":"GetTask","params":{}}',
    "an unpaired surrogate as the method": '{"jsonrpc":"2.0","id":1,"method":"\\udc00","params":{}}',
    "an unpaired surrogate as a tool's name": '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800"}}',
    "NaN in a data part": SEND % '"parts":[{"data":{"n":NaN}}]',
    "Infinity as the id": '{"jsonrpc":"2.0","id":Infinity,"method":"ping"}',
    "a number beyond 64 bits": '{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}',
    "NUL in the context id": SEND % '"contextId":"a\\u0000","parts":[{"text":"q"}]',
    "NUL in the query": '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"query":"\\u0000"}}}',
    "bytes that are not UTF-8": b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',
    "nothing": b"",
}


@pytest.fixture
def bearer(api_caller: ApiCaller) -> Client:
    make_agent(slug="company-assistant", servers=[], with_demo_rules=False)
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}", raise_request_exception=False)


@pytest.mark.parametrize("path", ["/a2a/company-assistant/", "/mcp/"])
@pytest.mark.parametrize("label", list(RPC_BODIES))
def test_a_json_rpc_body_is_parsed_bounded_and_refused_as_a_parse_error(bearer: Client, path: str, label: str) -> None:
    response = bearer.post(path, RPC_BODIES[label], content_type="application/json")
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])
    answer = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32700, answer


def test_a_json_rpc_body_within_the_bounds_still_works(bearer: Client) -> None:
    body = {"jsonrpc": "2.0", "id": "가", "method": "ping"}
    response = bearer.post("/mcp/", json.dumps(body, ensure_ascii=False), content_type="application/json")
    assert response.json() == {"jsonrpc": "2.0", "id": "가", "result": {}}
    assert "가".encode() in response.content


@pytest.mark.parametrize("path", ["/a2a/company-assistant/", "/mcp/"])
def test_a_json_rpc_body_over_the_api_s_limit_is_a_json_413(bearer: Client, path: str, settings: Any) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "y" * 3_000_000}})
    response = bearer.post(path, body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert str(settings.PLATFORM_API_MAX_BODY_BYTES) in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/a2a/company-assistant/x"),
        ("GET", "/a2a/%ff/.well-known/agent-card.json"),
        ("GET", "/a2a/company-assistant/.well-known/nope"),
        ("POST", "/mcp/extra"),
        ("GET", "/.well-known/nope"),
    ],
)
def test_an_unknown_path_beside_the_protocols_is_a_json_404(bearer: Client, method: str, path: str) -> None:
    response = bearer.generic(method, path, "{}", content_type="application/json")
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "Not found."}}


def test_the_errors_answered_before_any_view_keep_korean_as_it_is(bearer: Client) -> None:
    response = bearer.post(
        "/api/v1/runs",
        b"{}",
        content_type="application/json",
        CONTENT_LENGTH=str(50 * 1024 * 1024),
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert response.status_code == 413
    text = response.content.decode("utf-8")
    assert "\\u" not in text and "바이트" in text, text
    response = bearer.post(
        "/api/v1/runs", b"{}", content_type="application/json", CONTENT_LENGTH="lots", HTTP_ACCEPT_LANGUAGE="ko"
    )
    assert response.status_code == 400 and "\\u" not in response.content.decode("utf-8")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runs/%00",
        "/api/v1/runs?agent=%00",
        "/api/v1/runs?agent=a%00b",
        "/api/v1/evals/sets/%00",
        "/api/v1/evals/runs?set=%00",
        "/api/v1/evals/runs?agent=%00",
        "/a2a/%00/.well-known/agent-card.json",
    ],
)
def test_a_nul_in_an_api_path_or_query_is_a_400_before_any_view(bearer: Client, path: str) -> None:
    response = bearer.get(path)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


def _cursor(position: str) -> str:
    return base64.b64encode(urlencode({"p": position}).encode()).decode()  # as DRF encodes its cursors


@pytest.mark.parametrize(
    "position",
    ["0001-01-01 00:00:00+05:00", "9999-12-31T23:59:59-12:00", "yesterday", "2026-01-01 00:00:00", "2026-02-30T00:00Z"],
)
def test_a_cursor_whose_position_is_no_comparable_moment_is_a_400_on_the_cursor(bearer: Client, position: str) -> None:
    response = bearer.get("/api/v1/runs", {"cursor": _cursor(position)})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"cursor": ["Invalid cursor."]}


def test_a_cursor_at_a_real_moment_still_pages(bearer: Client) -> None:
    response = bearer.get("/api/v1/runs", {"cursor": _cursor("2026-01-01 00:00:00.123456+00:00")})
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


EDGE_MOMENTS = [
    "since=0001-01-01",
    "until=9999-12-31",
    "since=0001-01-01T00:00:00%2B14:00",
    "until=9999-12-31T23:59:59-12:00",
    "since=0001-01-01&until=9999-12-31",
]


@pytest.mark.parametrize(
    "path",
    [
        *(f"events?{query}" for query in EDGE_MOMENTS),
        "events?since=0001-01-01T00:00:00%2B14:00&format=jsonl",
        "events?until=9999-12-31&format=csv",
        *(f"metrics?{query}" for query in EDGE_MOMENTS),
    ],
)
def test_an_auditor_s_moments_at_the_ends_of_the_calendar_mean_from_the_start_and_to_the_end(
    auditor_user: Any, path: str
) -> None:
    credentials = base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()
    client = Client(HTTP_AUTHORIZATION=f"Basic {credentials}", raise_request_exception=False)
    response = client.get(f"/api/v1/audit/{path}")
    assert response.status_code == 200, response.content[:300]
    b"".join(response.streaming_content) if response.streaming else response.content  # a stream ends whole


def test_the_metrics_of_a_period_ending_at_the_start_of_the_calendar_are_empty(auditor_user: Any) -> None:
    credentials = base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()
    client = Client(HTTP_AUTHORIZATION=f"Basic {credentials}", raise_request_exception=False)
    response = client.get("/api/v1/audit/metrics?until=0001-01-01")
    assert response.status_code == 200, response.content[:300]


def test_a_username_with_a_nul_is_no_user_and_is_not_looked_for(django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):
        assert LockoutModelBackend().authenticate(None, username="ro\x00ot", password="x") is None
    credentials = base64.b64encode(b"ro\x00ot:x").decode()
    response = Client(HTTP_AUTHORIZATION=f"Basic {credentials}").get("/api/v1/audit/events")
    assert response.status_code == 401


def test_a_body_that_is_not_json_and_a_blank_query_are_told_in_korean_saying_where(bearer: Client) -> None:
    broken = bearer.post(
        "/api/v1/runs",
        '{"agent": "company-assistant", "query": }',
        content_type="application/json",
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert broken.status_code == 400
    assert broken.json()["error"]["message"] == "본문이 올바른 JSON이 아닙니다: 1행 41열: 값이 와야 합니다"
    blank = bearer.post(
        "/api/v1/runs",
        {"agent": "company-assistant", "query": "  "},
        content_type="application/json",
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert blank.status_code == 400
    assert blank.json()["error"]["fields"]["query"] == ["이 필드는 비워 둘 수 없습니다."]


def test_format_in_the_query_is_not_a_renderer_switch_that_hides_a_run(bearer: Client) -> None:
    """DRF's ?format= override answered an unknown renderer as a 404: a client read its own run as gone and a
    POST created nothing. The API speaks JSON; ``format`` is no parameter of these endpoints: a 400 naming it, as
    any parameter an endpoint does not take, never a 404."""
    body = json.dumps({"agent": "company-assistant", "query": "안녕"})
    refused = bearer.post("/api/v1/runs?format=yaml", body, content_type="application/json")
    assert refused.status_code == 400 and "format" in refused.json()["error"]["fields"]
    created = bearer.post("/api/v1/runs", body, content_type="application/json")
    assert created.status_code in (201, 202), created.content
    run_id = created.json()["id"]
    shown = bearer.get(f"/api/v1/runs/{run_id}?format=xml")
    assert shown.status_code == 400 and "format" in shown.json()["error"]["fields"]
    listed = bearer.get("/api/v1/runs?format=json")
    assert listed.status_code == 400 and "format" in listed.json()["error"]["fields"]


def test_a_response_the_client_will_not_accept_is_a_406_named_so(bearer: Client) -> None:
    response = bearer.get("/api/v1/runs", HTTP_ACCEPT="application/xml")
    assert response.status_code == 406
    assert response.json()["error"]["code"] == "not_acceptable"


@pytest.mark.parametrize("rpc_id", ["1.5", "{}", "[1]", "true"])
@pytest.mark.parametrize("path", ["/a2a/company-assistant/", "/mcp/"])
def test_a_json_rpc_id_no_client_could_match_is_an_invalid_request_and_nothing_is_done(
    bearer: Client, path: str, rpc_id: str
) -> None:
    from agents.models import Run

    if path == "/mcp/":
        call = '{"name":"ask_company-assistant","arguments":{"query":"안녕"}}'
        body = f'{{"jsonrpc":"2.0","id":{rpc_id},"method":"tools/call","params":{call}}}'
    else:
        body = SEND.replace('"id":"r1"', f'"id":{rpc_id}') % '"parts":[{"text":"안녕"}]'
    answer = bearer.post(path, body, content_type="application/json").json()
    assert answer["id"] is None and answer["error"]["code"] == -32600
    assert not Run.objects.exists()


def test_an_mcp_request_id_may_be_text_or_an_integer(bearer: Client) -> None:
    for rpc_id in ('"p-1"', "7"):
        body = f'{{"jsonrpc":"2.0","id":{rpc_id},"method":"ping"}}'
        assert bearer.post("/mcp/", body, content_type="application/json").json()["id"] == json.loads(rpc_id)


@pytest.mark.parametrize("field", ["contextId", "messageId", "taskId"])
def test_an_a2a_message_id_that_is_not_short_text_is_an_invalid_param(bearer: Client, field: str) -> None:
    from agents.models import Run

    for value in ('{"x":[1]}', "7", json.dumps("m" * 201)):
        body = SEND.replace('"messageId":"m1",', "") % f'"{field}":{value},"parts":[{{"text":"안녕"}}]'
        answer = bearer.post("/a2a/company-assistant/", body, content_type="application/json").json()
        assert answer["error"]["code"] == -32602, (field, value)
        assert field in answer["error"]["message"]
    assert not Run.objects.exists()


def test_a2a_message_ids_and_rest_idempotency_keys_never_share_a_run(bearer: Client) -> None:
    """A REST key that reads like an A2A message's (``a2a:m-9``) and an A2A messageId ``m-9`` are two requests;
    two long message ids that differ only at their end are two messages."""
    from agents.models import Run

    rest = bearer.post(
        "/api/v1/runs",
        json.dumps({"agent": "company-assistant", "query": "안녕"}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="a2a:m-9",
    )
    assert rest.status_code in (201, 202)

    def send(message_id: str) -> Any:
        message = {"role": "ROLE_USER", "messageId": message_id, "parts": [{"text": "안녕"}]}
        params = {"message": message, "configuration": {"returnImmediately": True}}
        body = {"jsonrpc": "2.0", "id": "r1", "method": "SendMessage", "params": params}
        return bearer.post("/a2a/company-assistant/", json.dumps(body), content_type="application/json").json()

    for message_id in ("m-9", "x" * 199 + "1", "x" * 199 + "2"):
        assert "result" in send(message_id)
    assert Run.objects.count() == 4
    assert "result" in send("m-9")
    assert Run.objects.count() == 4  # the same message again: the same run


def test_an_a2a_message_stored_under_the_former_key_is_not_run_again(bearer: Client, api_caller: ApiCaller) -> None:
    """Before 2026-12-04 a message's run was keyed ``a2a:<messageId>``: the same message retried across the upgrade
    gets that run back, not a second one (a write runs at most once)."""
    from agents.models import Agent, Run
    from agents.services import request_digest

    message = {"role": "ROLE_USER", "messageId": "m-old", "parts": [{"text": "안녕"}]}
    old = Run.objects.create(
        agent=Agent.objects.get(slug="company-assistant"),
        api_key=api_caller.key,
        query="안녕",
        idempotency_key="a2a:m-old",
        request_digest=request_digest({"agent": "company-assistant", "message": message, "metadata": {}}),
    )
    params = {"message": message, "configuration": {"returnImmediately": True}}
    body = {"jsonrpc": "2.0", "id": "r1", "method": "SendMessage", "params": params}
    answer = bearer.post("/a2a/company-assistant/", json.dumps(body), content_type="application/json").json()
    assert answer["result"]["task"]["id"] == str(old.pk)
    assert Run.objects.count() == 1
