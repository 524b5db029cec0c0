"""The shared JSON parser placed none of its refusals: a NUL, an unpaired surrogate, an integer beyond 64 bits, a
NaN or a key given twice anywhere in a body was ``400 invalid_json`` "Text may not contain NUL characters." with no
word of where, so a caller could not find it in a large body. Now the message starts with the path
(``context.userId: …``) and the REST answer's ``fields`` names it; the status and code are as they were. And a
request with no ``Content-Type`` was DRF's ``415 Unsupported media type "" in request.``: now it says what to send."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.exceptions import ParseError

from agents.api.parsers import json_parse_bounded
from agents.models import Run
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
A2A = "/a2a/company-assistant/"
NUL = "Text may not contain NUL characters."


@pytest.fixture
def bearer(api_caller: ApiCaller) -> Client:
    make_agent(slug="company-assistant", servers=[], with_demo_rules=False)
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}", raise_request_exception=False)


def post_raw(client: Client, path: str, body: str, content_type: str = "application/json") -> Any:
    return client.generic("POST", path, body.encode(), content_type=content_type)


def refusal(raw: str) -> str:
    with pytest.raises(ParseError) as refused:
        json_parse_bounded(raw.encode(), max_depth=32)
    return str(refused.value.detail)


@pytest.mark.parametrize(
    ("context", "path", "problem"),
    [
        ('{"userId": "김\\u0000하늘"}', "context.userId", NUL),
        (
            '{"rows": [1, 2, 3, 99999999999999999999]}',
            "context.rows[3]",
            "The integer 99999999999999999999 is out of range.",
        ),
        ('{"부서": {"점수": NaN}}', "context.부서.점수", "NaN is not a JSON number."),
        (
            '{"a-b": ["x", "\\ud800"]}',
            'context["a-b"][1]',
            "Text may not contain unpaired surrogates (\\ud800–\\udfff).",
        ),
    ],
    ids=["nul", "integer", "nan", "surrogate"],
)
def test_a_value_no_database_stores_is_refused_naming_its_path_in_the_message_and_fields(
    bearer: Client, context: str, path: str, problem: str
) -> None:
    body = '{"agent": "company-assistant", "query": "안녕", "context": CONTEXT}'.replace("CONTEXT", context)

    response = post_raw(bearer, RUNS, body)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_json"
    assert error["message"] == f"{path}: {problem}"
    assert error["fields"] == {path: [problem]}
    assert not Run.objects.exists()


def test_the_first_problem_in_the_body_is_the_one_named() -> None:
    raw = '{"a2a_data": [{"rows": [0, 1, 2, 99999999999999999999]}], "later": "\\u0000"}'
    assert refusal(raw) == "a2a_data[0].rows[3]: The integer 99999999999999999999 is out of range."


def test_a_key_with_a_nul_is_named_with_the_nul_written_out() -> None:
    assert refusal('{"context": {"a\\u0000b": 1}}') == f'context["a\\u0000b"]: {NUL}'


def test_a_key_given_twice_in_a_nested_object_is_placed() -> None:
    raw = '{"context": {"x": {"decision": "reject", "decision": "approve"}}}'
    assert refusal(raw) == 'context.x: The key "decision" is given twice in one object.'


def test_a_key_on_the_path_is_masked_and_cut() -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"
    detail = refusal(json.dumps({secret: {"k" * 5000: "\x00"}}))
    assert secret not in detail
    assert '["' + "k" * 100 + '…"]' in detail
    assert detail.endswith(NUL)


def test_a_problem_in_the_body_itself_is_said_without_a_path(bearer: Client) -> None:
    assert refusal('"a\\u0000b"') == NUL
    response = post_raw(bearer, RUNS, "99999999999999999999")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "invalid_json",
        "message": "The integer 99999999999999999999 is out of range.",
    }


def test_a2a_names_the_path_in_its_parse_error(bearer: Client) -> None:
    message = {"role": "ROLE_USER", "parts": [{"text": "안녕"}, {"data": {"userId": "a\x00b"}}]}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}})

    response = post_raw(bearer, A2A, body)

    error = response.json()["error"]
    assert error["code"] == -32700
    assert "params.message.parts[1].data.userId: " + NUL in error["message"]


def test_a_request_with_no_content_type_is_told_what_to_send(bearer: Client) -> None:
    response = post_raw(bearer, RUNS, '{"agent": "company-assistant", "query": "안녕"}', content_type="")

    assert response.status_code == 415, response.content
    assert response.json()["error"] == {
        "code": "unsupported_media_type",
        "message": "The request has no Content-Type: send Content-Type: application/json.",
    }


def test_another_content_type_keeps_drfs_words(bearer: Client) -> None:
    response = post_raw(bearer, RUNS, "agent=x&query=y", content_type="text/plain")

    assert response.status_code == 415
    assert response.json()["error"]["message"] == 'Unsupported media type "text/plain" in request.'
