"""What a fuzz of the API (schemathesis and by hand) found, fixed:

1. the auditors' API read only the last value of a parameter given twice (``?ok=false&ok=true`` as ``ok=true``):
   refused, naming it, as the REST API refuses it;
2. ``since=0001-01-01`` ("from the start") was echoed as 1900 in Asia/Seoul's local mean time (+08:27:52), which
   JavaScript's ``Date`` cannot read;
3. a JSON body in another charset than UTF-8 was a 400 on the REST API, a 415 on A2A and MCP: a 415 on all;
4. the schema let ``data`` and ``files`` go with ``message``, which the server refuses;
5. a message's data part had to be an object on REST, any JSON value on A2A: any value on both, stored alike;
6. MCP's body-less 202s said ``Content-Type: text/html``;
7. ``page_size`` (and the auditors' ``limit`` and ``cursor``) read full-width and other non-ASCII digits.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import jsonschema
import pytest
from django.test import Client
from rest_framework.test import APIClient

from agents.models import Agent, Run
from tests.conftest import AUDITOR_PASSWORD, ApiCaller, make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
AUDIT = "/api/v1/audit"
MESSAGE = {"role": "user", "parts": [{"kind": "text", "text": "주문 상태를 알려주세요"}]}


@pytest.fixture
def agent(db: Any) -> Agent:
    """An agent without servers: enough to queue runs (no worker runs them here)."""
    return make_agent(slug="company-assistant", servers=[], with_demo_rules=False)


@pytest.fixture
def auditor(auditor_user: Any) -> Client:
    credentials = base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()
    return Client(HTTP_AUTHORIZATION=f"Basic {credentials}")


def bearer(caller: ApiCaller) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")


def submit(caller: ApiCaller, body: Any, content_type: str = "application/json") -> Any:
    return bearer(caller).post(RUNS, body if isinstance(body, str | bytes) else json.dumps(body), content_type)


# --- 1. a parameter given twice ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "events?agent=company-assistant&agent=zzz",
        "events?ok=false&ok=true",
        "events?ok=false&ok=true&format=csv",
        "events?agent=zzz&agent=company-assistant&format=jsonl",
        "metrics?agent=company-assistant&agent=zzz",
        "metrics?since=2026-01-01&since=2026-02-01",
    ],
)
def test_the_auditors_api_refuses_a_parameter_given_twice_as_the_rest_api_does(
    auditor: Client, api_caller: ApiCaller, path: str
) -> None:
    name = path.split("?")[1].split("=")[0]
    response = auditor.get(f"{AUDIT}/{path}")
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error == {
        "code": "invalid_input",
        "message": f"This query parameter was given more than once: '{name}'. Give it once.",
        "fields": {name: ["Given more than once."]},
    }
    rest = bearer(api_caller).get(f"{RUNS}?agent=a&agent=b").json()["error"]  # the REST API's words for it
    assert rest == {
        **error,
        "message": error["message"].replace(name, "agent"),
        "fields": {"agent": error["fields"][name]},
    }


def test_an_auditor_s_filters_given_once_still_answer(auditor: Client) -> None:
    assert auditor.get(f"{AUDIT}/events?agent=company-assistant&ok=true").status_code == 200
    assert auditor.get(f"{AUDIT}/metrics?agent=company-assistant").status_code == 200


# --- 2. from the start, in an offset a reader can parse ------------------------------------------------------


@pytest.mark.parametrize("since", ["0001-01-01", "1900-01-01", "1907-06-01T00:00:00", "0001-01-01T00:00:00+14:00"])
def test_metrics_from_the_start_echo_a_moment_with_a_whole_hour_offset(auditor: Client, since: str) -> None:
    response = auditor.get(f"{AUDIT}/metrics", {"since": since})
    assert response.status_code == 200, response.content[:300]
    echoed = response.json()["since"]
    assert echoed == "1970-01-01T09:00:00+09:00"  # the settings' Asia/Seoul
    offset = dt.datetime.fromisoformat(echoed).utcoffset()
    assert offset is not None and offset.total_seconds() % 3600 == 0


def test_a_moment_after_the_start_is_kept_as_typed(auditor: Client) -> None:
    response = auditor.get(f"{AUDIT}/metrics", {"since": "1970-06-01", "until": "1970-06-02"})
    assert response.status_code == 200, response.content[:300]
    assert response.json()["since"] == "1970-06-01T00:00:00+09:00"
    assert auditor.get(f"{AUDIT}/events", {"since": "0001-01-01"}).status_code == 200


# --- 3. a charset other than UTF-8 --------------------------------------------------------------------------------


@pytest.mark.parametrize("charset", ["latin-1", "euc-kr", "utf-16", "klingon"])
def test_a_body_in_another_charset_is_a_415_as_on_a2a_and_mcp(
    api_caller: ApiCaller, agent: Agent, charset: str
) -> None:
    text = json.dumps({"agent": agent.slug, "query": "안녕"}, ensure_ascii=False)
    body = text.encode("utf-8" if charset == "klingon" else charset, "replace")  # generic(): sent as it is
    content_type = f"application/json; charset={charset}"
    response = bearer(api_caller).generic("POST", RUNS, body, content_type=content_type)
    assert response.status_code == 415, response.content
    error = response.json()["error"]
    wrong_type = submit(api_caller, text, content_type="text/plain").json()["error"]
    assert error["code"] == wrong_type["code"] == "unsupported_media_type"
    assert error["message"] == f"JSON must be UTF-8, not {charset}."
    assert bearer(api_caller).generic("POST", "/mcp/", body, content_type=content_type).status_code == 415
    assert not Run.objects.exists()


# --- 4. and 5. the schema of POST /runs, as the server takes it ------------------------------------------------


@pytest.fixture
def run_body_schema() -> jsonschema.Draft4Validator:
    schema = APIClient().get("/api/v1/schema/?format=json").json()
    document = {"components": schema["components"], "$ref": "#/components/schemas/RunCreateRequest"}
    return jsonschema.Draft4Validator(document)


def branch_example(schema: jsonschema.Draft4Validator, branch: dict[str, Any], agent: Agent) -> dict[str, Any]:
    """An example of one ``oneOf`` branch of the served schema: its required member, with every optional member
    of the request that the branch does not forbid (``data`` and ``files`` empty)."""
    values: dict[str, Any] = {"query": "질문", "message": MESSAGE, "data": [], "files": []}
    body = {"agent": agent.slug, **{name: values[name] for name in branch["required"]}}
    for name in ("data", "files"):
        if jsonschema.Draft4Validator(branch).is_valid({**body, name: []}):
            body[name] = []
    return body


def test_each_branch_of_the_submission_schema_is_what_the_server_takes(
    run_body_schema: jsonschema.Draft4Validator, api_caller: ApiCaller, agent: Agent
) -> None:
    branches = run_body_schema.schema["components"]["schemas"]["RunCreateRequest"]["oneOf"]
    for branch in branches:
        body = branch_example(run_body_schema, branch, agent)
        assert not list(run_body_schema.iter_errors(body)), body
        response = submit(api_caller, body)
        assert response.status_code == 202, (body, response.content)
    for name in ("data", "files"):
        body = {"agent": agent.slug, "message": MESSAGE, name: []}
        assert list(run_body_schema.iter_errors(body)), body
        response = submit(api_caller, body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["error"]["fields"] == {name: ["With 'message', send this as a part of the message."]}


@pytest.mark.parametrize(
    ("part", "stored"),
    [
        ({"kind": "data", "data": [1, 2]}, {"value": [1, 2]}),
        ({"data": [1, 2]}, {"value": [1, 2]}),
        ({"data": 5}, {"value": 5}),
        ({"data": "주문"}, {"value": "주문"}),
        ({"data": None}, {"value": None}),
        ({"kind": "data", "data": {"order": 1}}, {"order": 1}),
    ],
)
def test_a_data_part_of_any_json_value_is_stored_as_the_a2a_endpoint_stores_it(
    run_body_schema: jsonschema.Draft4Validator, api_caller: ApiCaller, agent: Agent, part: Any, stored: Any
) -> None:
    message = {"role": "user", "parts": [{"kind": "text", "text": "안녕"}, part]}
    body = {"agent": agent.slug, "message": message}
    assert not list(run_body_schema.iter_errors(body)), body
    response = submit(api_caller, body)
    assert response.status_code == 202, response.content
    assert Run.objects.get(id=response.json()["id"]).a2a_data == [stored]

    a2a_part = {key: value for key, value in part.items() if key != "kind"}
    a2a_body = {
        "jsonrpc": "2.0",
        "id": "r1",
        "method": "SendMessage",
        "params": {
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "안녕"}, a2a_part]},
            "configuration": {"returnImmediately": True},
        },
    }
    a2a = bearer(api_caller).post(f"/a2a/{agent.slug}/", json.dumps(a2a_body), content_type="application/json")
    assert a2a.status_code == 200, a2a.content
    task_id = a2a.json()["result"]["task"]["id"]
    assert Run.objects.get(id=task_id).a2a_data == [stored]


# --- 6. MCP's 202s ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 3, "result": {}},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}},
    ],
)
def test_mcp_s_body_less_202_claims_no_html(api_caller: ApiCaller, message: dict[str, Any]) -> None:
    response = bearer(api_caller).post(
        "/mcp/", json.dumps(message), content_type="application/json", headers={"Accept": "application/json"}
    )
    assert response.status_code == 202
    assert response.content == b""
    assert "Content-Type" not in response


# --- 7. numbers in ASCII digits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("digits", ["\uff15", "\u0665", "1\uff10"])  # ５, Arabic-Indic 5, 1０
def test_page_size_in_non_ascii_digits_is_refused_as_any_other_non_number(
    api_caller: ApiCaller, auditor: Client, digits: str
) -> None:
    client = bearer(api_caller)
    response = client.get(RUNS, {"page_size": digits})
    assert response.status_code == 400, response.content
    assert response.json()["error"] == client.get(RUNS, {"page_size": "many"}).json()["error"]
    assert response.json()["error"]["fields"] == {"page_size": ["A valid integer is required."]}
    assert client.get(RUNS, {"page_size": "5"}).status_code == 200
    for name in ("limit", "cursor"):
        refused = auditor.get(f"{AUDIT}/events", {name: digits})
        assert refused.status_code == 400, refused.content
        assert refused.json()["error"]["fields"] == {name: ["A valid integer is required."]}


@pytest.mark.parametrize("digits", ["1_0", "1_000"])
def test_page_size_grouped_by_underscores_is_refused_as_wait_refuses_it(
    api_caller: ApiCaller, auditor: Client, digits: str
) -> None:
    """Python's ``int`` reads ``1_0`` as 10: the page size was 10, where ``?wait=1_0`` is refused."""
    client = bearer(api_caller)
    response = client.get(RUNS, {"page_size": digits})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"page_size": ["A valid integer is required."]}
    refused = auditor.get(f"{AUDIT}/events", {"limit": digits})
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["fields"] == {"limit": ["A valid integer is required."]}
