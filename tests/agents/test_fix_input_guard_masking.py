"""A caller's input is masked by the audit's rules before a run stores or shows it, and a cursor that names no
position is refused.

1. ``run_input_guarded`` masked with a weaker pass of its own: name/value entries and header pairs, one-time
   codes, PINs and card codes under their names, and any key holding "session" (``session_token``) were stored in
   ``Run.context``/``Run.a2a_data`` and answered by ``POST /runs`` and ``GET /runs/{id}`` in clear, though the
   audit hid them. Only a session's id (a conversation's) is kept.
2. ``?cursor=YWJj`` (base64 of "abc"), text with neither a position nor DRF's ``p=``, paged from the start.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent, Run
from agents.services import run_input_guarded
from audit.masking import MASK, mask_value
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"

CONTEXT = {
    "userId": "E-1001",
    "sessionId": "세션-0001",
    "contextId": "대화-0001",
    "팀": "클라우드운영팀",
    "otp": "482913",
    "card_pin": "7391",
    "verification_code": "563208",
    "인증번호": "918273",
    "cvv": "847",
    "session_token": "s3ss10nT0kenValue99",
    "session_secret": "SessSecretValue4711",
    "sessionPassword": "SessPassw0rdValue88",
}
DATA = [
    {
        "주문": {"번호": "O-1001", "메모": "빠른 배송 부탁드립니다"},
        "headers": [
            {"name": "X-Api-Key", "value": "Zx9pQ7mN3qqqWW"},
            {"name": "Authorization", "value": "Basic dXNlcjpwYXNzd29yZDEyMw=="},
        ],
        "env": [{"name": "DB_PASSWORD", "value": "Sup3rS3cretValue"}],
        "Tags": [{"Key": "api_token", "Value": "abc123def456ghi"}],
        "header_pairs": [["X-Api-Key", "PairedKeyValue5150"]],
    }
]
HIDDEN = [
    "482913",
    "563208",
    "918273",
    "s3ss10nT0kenValue99",
    "SessSecretValue4711",
    "SessPassw0rdValue88",
    "Zx9pQ7mN3qqqWW",
    "dXNlcjpwYXNzd29yZDEyMw==",
    "Sup3rS3cretValue",
    "abc123def456ghi",
    "PairedKeyValue5150",
]


@pytest.fixture
def assistant(db: Any) -> Agent:
    return make_agent(slug="company-assistant", servers=[], with_demo_rules=False)


def test_a_callers_codes_name_value_secrets_and_session_credentials_are_never_stored_or_answered(
    api_client: APIClient, assistant: Agent
) -> None:
    body = {"agent": "company-assistant", "query": "결제 진행해줘", "context": CONTEXT, "data": DATA}
    created = api_client.post(URL, json.dumps(body, ensure_ascii=False), content_type="application/json")
    assert created.status_code == 202, created.content
    read = api_client.get(f"{URL}/{created.json()['id']}")
    assert read.status_code == 200
    run = Run.objects.get(id=created.json()["id"])
    stored = json.dumps(list(Run.objects.values("query", "context", "a2a_data", "a2a_files")), ensure_ascii=False)
    for text in (created.content.decode(), read.content.decode(), stored):
        for secret in HIDDEN:
            assert secret not in text, secret
    # The short codes (a PIN, a card's code) are checked where they were given.
    masked_keys = ("otp", "card_pin", "verification_code", "인증번호", "cvv", "session_token", "session_secret")
    for key in (*masked_keys, "sessionPassword"):
        assert run.context[key] == MASK, key
        assert created.json()["context"][key] == read.json()["context"][key] == MASK, key
    # A session's and a conversation's ids, and ordinary Korean values, are kept as they were sent.
    kept = {key: CONTEXT[key] for key in ("userId", "sessionId", "contextId", "팀")}
    assert {key: run.context[key] for key in kept} == kept
    assert {key: read.json()["context"][key] for key in kept} == kept
    assert run.a2a_data[0]["주문"] == {"번호": "O-1001", "메모": "빠른 배송 부탁드립니다"}
    assert run.a2a_data[0]["headers"][0] == {"name": "X-Api-Key", "value": MASK}
    assert run.a2a_data[0]["header_pairs"] == [["X-Api-Key", MASK]]


def test_the_run_record_masks_what_the_audit_masks_but_a_sessions_id() -> None:
    given = {**CONTEXT, "data": DATA}
    audited = mask_value(given)
    guarded = run_input_guarded(given, [])
    assert guarded == {**audited, "sessionId": "세션-0001"}
    assert audited["sessionId"] == MASK  # what the audit hides of it, the run keeps: a conversation's id


def test_a_secret_pattern_or_a_known_secret_given_as_a_sessions_id_is_still_masked() -> None:
    given = {"sessionId": "known-bound-secret-77", "session_id": "Bearer abcdefghijklmnopqrstuvwx"}
    assert run_input_guarded(given, ["known-bound-secret-77"]) == {"sessionId": MASK, "session_id": "Bearer ***"}


@pytest.mark.parametrize("cursor", ["YWJj", "====", "eD0x"])  # "abc", "", "x=1": neither a position nor DRF's
def test_a_cursor_that_names_no_position_is_a_400_on_cursor(
    api_client: APIClient, api_caller: ApiCaller, assistant: Agent, cursor: str
) -> None:
    Run.objects.create(agent=assistant, api_key=api_caller.key, query="q")
    response = api_client.get(f"{URL}?cursor={cursor}")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert "cursor" in response.json()["error"]["fields"]


def test_a_cursor_the_api_wrote_still_pages(api_client: APIClient, assistant: Agent) -> None:
    for i in range(3):
        api_client.post(URL, {"agent": "company-assistant", "query": f"q{i}"}, format="json")
    first = api_client.get(f"{URL}?page_size=2").json()
    second = api_client.get(first["next"])
    assert second.status_code == 200
    assert [run["query"] for run in first["results"] + second.json()["results"]] == ["q2", "q1", "q0"]
