"""A2A input: a message's parts map onto the run (query, a2a_data, a2a_files metadata, context), and from there
onto the deterministic rules' conditions and params (seed 000's DeterministicContext)."""

from __future__ import annotations

import base64
import json

import pytest

from agents.execution import run_execute
from agents.models import DeterministicRule, Run
from audit.models import AuditEvent
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def a2a(*parts: dict, **fields) -> dict:
    return {"agent": "company-assistant", "message": {"role": "user", "parts": list(parts)}, **fields}


def text(value: str) -> dict:
    return {"kind": "text", "text": value}


def data(value: dict) -> dict:
    return {"kind": "data", "data": value}


def file(**value) -> dict:
    return {"kind": "file", "file": value}


def test_a_message_maps_onto_the_runs_query_context_data_and_files(api_client, demo_agent) -> None:
    content = "비밀 계약서 내용".encode()
    response = api_client.post(
        URL,
        a2a(
            text("김하늘 님은"),
            data({"order": {"id": "O-1001"}}),
            text("어느 팀 소속인가요?"),
            file(name="계약서.pdf", mimeType="application/pdf", bytes=base64.b64encode(content).decode()),
            file(name="r.png", mimeType="image/png", uri="https://files.example.com/r.png"),
            context={"userId": "E-1001", "sessionId": "s-1", "chatbotId": "premium-support"},
        ),
        format="json",
    )
    assert response.status_code == 202, response.content
    run = Run.objects.get(id=response.json()["id"])
    assert run.query == "김하늘 님은\n어느 팀 소속인가요?"
    assert run.context == {"userId": "E-1001", "sessionId": "s-1", "chatbotId": "premium-support"}
    assert run.a2a_data == [{"order": {"id": "O-1001"}}]
    assert run.a2a_files == [
        {"name": "계약서.pdf", "mimeType": "application/pdf", "size": len(content)},
        {"name": "r.png", "mimeType": "image/png", "uri": "https://files.example.com/r.png"},
    ]
    body = response.json()
    assert body["a2a_files"] == run.a2a_files


def test_a_callers_password_or_token_in_context_or_data_is_masked_before_it_is_stored(api_client, demo_agent) -> None:
    response = api_client.post(
        URL,
        a2a(
            text("김하늘 님은 어느 팀 소속인가요?"),
            data({"order": {"id": "O-1", "access_token": "tok-data-9f8e7d6c"}, "pw": "hunter2-data"}),
            context={"sessionId": "s-1", "password": "hunter2-secret", "userPassword": "", "tokens_used": 12},
        ),
        format="json",
    )
    assert response.status_code == 202, response.content
    run = Run.objects.get(id=response.json()["id"])
    # A session's id is a conversation's, a count of tokens is no token, an empty value hides nothing.
    assert run.context == {"sessionId": "s-1", "password": "***", "userPassword": "", "tokens_used": 12}
    assert run.a2a_data == [{"order": {"id": "O-1", "access_token": "***"}, "pw": "***"}]
    stored = json.dumps([list(Run.objects.values()), list(AuditEvent.objects.values())], default=str)
    assert "hunter2" not in stored and "tok-data" not in stored


def test_a_files_bytes_are_never_stored(api_client, demo_agent) -> None:
    encoded = base64.b64encode(b"SECRET-FILE-CONTENT-0123456789").decode()
    response = api_client.post(URL, a2a(text("파일 확인"), file(name="x.bin", bytes=encoded)), format="json")
    assert response.status_code == 202
    stored = json.dumps(list(Run.objects.values()), default=str, ensure_ascii=False)
    assert encoded not in stored
    assert "SECRET-FILE-CONTENT" not in stored
    assert encoded not in response.content.decode()


def test_a_message_with_only_a_data_part_is_accepted_with_an_empty_query(api_client, demo_agent) -> None:
    response = api_client.post(URL, a2a(data({"asset": {"id": "A-1001"}})), format="json")
    assert response.status_code == 202
    run = Run.objects.get(id=response.json()["id"])
    assert (run.query, run.a2a_data) == ("", [{"asset": {"id": "A-1001"}}])


def test_a_message_in_a2a_1_0_form_is_taken_as_the_a2a_endpoint_takes_it(api_client, demo_agent) -> None:
    message = {
        "role": "ROLE_USER",
        "parts": [
            {"text": "김하늘 님은 어느 팀 소속인가요?"},
            {"data": {"asset": {"id": "A-1001"}}},
            {"url": "https://files.example/a.pdf", "mediaType": "application/pdf", "filename": "a.pdf"},
        ],
    }
    response = api_client.post(URL, {"agent": "company-assistant", "message": message}, format="json")
    assert response.status_code == 202, response.content
    run = Run.objects.get(id=response.json()["id"])
    assert (run.query, run.a2a_data) == ("김하늘 님은 어느 팀 소속인가요?", [{"asset": {"id": "A-1001"}}])
    assert run.a2a_files == [{"name": "a.pdf", "mimeType": "application/pdf", "uri": "https://files.example/a.pdf"}]
    both = api_client.post(URL, {"agent": "company-assistant", "query": "q", "message": message}, format="json")
    assert both.status_code == 400 and {"query", "message"} <= set(both.json()["error"]["fields"])


def test_the_a2a_message_envelope_fields_are_accepted(api_client, demo_agent) -> None:
    body = a2a(text("안녕하세요"))
    body["message"].update(kind="message", messageId="m-1", contextId="c-1", metadata={"client": "web"})
    assert api_client.post(URL, body, format="json").status_code == 202


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent": "company-assistant", "message": "hi"}, "message"),
        ({"agent": "company-assistant", "message": {"role": "user", "parts": []}}, "message"),
        ({"agent": "company-assistant", "message": {"role": "agent", "parts": [text("hi")]}}, "message"),
        ({"agent": "company-assistant", "message": {"parts": [text("hi")]}}, "message"),
        ({"agent": "company-assistant", "message": {"role": "user", "parts": [text("hi")], "colour": 1}}, "message"),
        (a2a({"kind": "image", "url": "x"}), "message"),
        (a2a({"texts": "neither a kind nor a known member"}), "message"),
        (a2a("just a string"), "message"),
        (a2a({"kind": "text", "text": 5}), "message"),
        (a2a({"kind": "text", "text": "hi", "extra": 1}), "message"),
        (a2a({"kind": "data"}), "message"),
        (a2a(text("   ")), "message"),
        (a2a(file(name="only a file", uri="https://x.example/f")), "message"),
        (a2a(text("hi"), file(name="f", uri="https://x.example/f", bytes="aGk=")), "message"),
        (a2a(text("hi"), file(name="f")), "message"),
        (a2a(text("hi"), file(name="f", bytes="not base64!")), "message"),
        (a2a(text("hi"), file(name="f", uri="no-scheme")), "message"),
        (a2a(text("hi"), file(name="f", uri="https://x.example/f", size=3)), "message"),
        (a2a(text("hi"), data={"x": 1}), "data"),
        (a2a(text("hi"), files=[]), "files"),
        (a2a(text("hi"), context=["not", "an", "object"]), "context"),
    ],
)
def test_a_malformed_message_is_a_400_naming_the_field(api_client, demo_agent, body, field) -> None:
    response = api_client.post(URL, body, format="json")
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "invalid_input"
    assert field in error["fields"], error
    assert Run.objects.count() == 0


def test_the_error_points_at_the_bad_part(api_client, demo_agent) -> None:
    response = api_client.post(URL, a2a(text("hi"), {"kind": "text", "text": 5}), format="json")
    assert response.status_code == 400
    assert error_of(response)["fields"]["message"]["parts"]["1"]["text"]


def test_an_overlong_message_text_is_a_413(api_client, demo_agent, settings) -> None:
    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 10
    response = api_client.post(URL, a2a(text("가" * 6), text("나" * 6)), format="json")
    assert response.status_code == 413
    assert error_of(response)["code"] == "query_too_long"


# --- from the API to the deterministic rules -----------------------------------------------------------------


@pytest.fixture
def routed_agent(demo_server):
    """Seed 000's example 2 as admin rules: route by the A2A context's chatbotId, and by an A2A data path."""
    agent = make_agent(slug="company-assistant", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent,
        server=demo_server,
        name="premium CRM lookup",
        order=10,
        tool_name="search_employee",
        when={"context": {"chatbotId": "premium-support"}},
        params={"name": "{context.userId}"},
        answer_template="{result.name}: {result.team}",
    )
    DeterministicRule.objects.create(
        agent=agent,
        server=demo_server,
        name="asset from data",
        order=20,
        tool_name="get_asset_status",
        when={"data": {"asset.id": "*"}},
        params={"asset_id": "{data.asset.id}"},
        answer_template="{result.asset_id}: {result.status}",
    )
    return agent


def submit_and_execute(api_client, body: dict) -> Run:
    response = api_client.post(URL, body, format="json")
    assert response.status_code == 202, response.content
    run_id = response.json()["id"]
    run_execute(run_id=run_id)
    return Run.objects.get(id=run_id)


def test_the_a2a_context_routes_a_rule_and_fills_its_params(api_client, routed_agent) -> None:
    run = submit_and_execute(
        api_client, a2a(text("내 정보 알려줘"), context={"chatbotId": "premium-support", "userId": "김하늘"})
    )
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    [result] = run.deterministic_results
    assert (result["rule"], result["tool"], result["args"], result["ok"]) == (
        "premium CRM lookup",
        "search_employee",
        {"name": "김하늘"},
        True,
    )
    assert run.answer == "김하늘: 클라우드운영팀"


def test_another_chatbot_does_not_match_and_the_reason_is_traced(api_client, routed_agent) -> None:
    run = submit_and_execute(api_client, a2a(text("내 정보"), context={"chatbotId": "basic", "userId": "김하늘"}))
    assert run.deterministic_results == []
    [decision, _] = [s for s in run.messages if s["type"] == "rule"]
    assert decision["matched"] is False
    assert "chatbotId" in decision["reason"]


def test_an_a2a_data_part_routes_a_rule_and_fills_its_params(api_client, routed_agent) -> None:
    run = submit_and_execute(api_client, a2a(text("상태 알려줘"), data({"asset": {"id": "A-1001"}})))
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    [result] = run.deterministic_results
    assert (result["tool"], result["args"], result["ok"]) == ("get_asset_status", {"asset_id": "A-1001"}, True)
    assert run.answer.startswith("A-1001: ")


def test_a_data_only_message_runs_on_its_data(api_client, routed_agent) -> None:
    run = submit_and_execute(api_client, a2a(data({"asset": {"id": "A-1002"}})))
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert [r["args"] for r in run.deterministic_results] == [{"asset_id": "A-1002"}]


def test_the_plain_body_routes_the_same_way(api_client, routed_agent) -> None:
    run = submit_and_execute(
        api_client,
        {
            "agent": "company-assistant",
            "query": "상태",
            "data": [{"asset": {"id": "A-1001"}}],
            "context": {"chatbotId": "premium-support", "userId": "박도윤"},
        },
    )
    assert [(r["tool"], r["args"]) for r in run.deterministic_results] == [
        ("search_employee", {"name": "박도윤"}),
        ("get_asset_status", {"asset_id": "A-1001"}),
    ]
