"""Three protocol defects found against a real stack.

1. A model failure's error text is stored in the run's language (its agent's: ``agents.engine.model_failure_message``)
   and was answered so to every reader: a Korean agent's failed run read "모델 서버에 연결할 수 없거나 … (3회 시도 후)"
   under ``Accept-Language: en`` on REST (``GET /runs/{id}``) and A2A. Now it is read back in the reader's language,
   the provider's own words kept as stored.
2. An A2A file part's ``url``/``uri`` that is not a URI of a file ("http://x/ a", "javascript:alert(1)") made a
   task; it is refused (``-32602``, ``400 invalid_input``) naming the part and the schemes taken.
3. MCP ``tools/call`` with ``params`` that are no object answered "Unknown tool: None"; it answers as the A2A
   endpoint does, "'params' must be an object.".
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.utils import translation

from agents.error_texts import error_message_text
from agents.execution import run_execute
from agents.model_texts import attempts_text, model_failure_text
from agents.models import Agent, Run
from mcpregistry.models import McpServer
from tests.conftest import ApiCaller, make_agent
from tests.postgres import free_port

pytestmark = pytest.mark.django_db


def caller_client(caller: ApiCaller, language: str = "en") -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}", HTTP_ACCEPT_LANGUAGE=language)


def a2a(client: Client, method: str, params: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    response = client.post("/a2a/company-assistant/", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


# --- 1. a model failure in the reader's language ---------------------------------------------------------------


@pytest.mark.slow
def test_a_korean_agents_model_failure_reads_in_the_callers_language(
    api_caller: ApiCaller, demo_server: McpServer
) -> None:
    agent = make_agent(
        slug="company-assistant", servers=[demo_server], provider="openai_compatible", with_demo_rules=False
    )
    # The model's server is a closed port: every call fails to connect, and is sent again twice.
    Agent.objects.filter(pk=agent.pk).update(
        language="ko",
        model_id="m",
        model_params={"base_url": f"http://127.0.0.1:{free_port()}/v1", "retry": {"max_attempts": 3, "backoff_s": 0}},
    )
    run = Run.objects.create(agent=agent, api_key=api_caller.key, query="오늘 날씨 어때?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")
    with translation.override("ko"):
        korean_sentence, korean_after = model_failure_text("connection"), attempts_text(3)
    assert run.error_message.startswith(korean_sentence + " ") and run.error_message.endswith(" " + korean_after)
    detail = run.error_message[len(korean_sentence) + 1 : -len(korean_after) - 1]  # the provider's own words
    assert detail
    english = f"The model server could not be reached, or the connection to it broke off. {detail} (after 3 attempts)"

    for language, message in (("en", english), ("ko", run.error_message)):
        client = caller_client(api_caller, language)
        rest = client.get(f"/api/v1/runs/{run.id}")
        assert rest.status_code == 200, rest.content
        assert rest.json()["error"] == {"code": "model:connection", "message": message}
        task = a2a(client, "GetTask", {"id": str(run.id)})["result"]
        assert task["status"]["state"] == "TASK_STATE_FAILED"
        said = " ".join(part.get("text", "") for part in task["status"]["message"]["parts"])
        assert message in said, said


@pytest.mark.parametrize("kind", ["throttled", "timeout", "connection", "unavailable", "validation", "auth", "error"])
@pytest.mark.parametrize("stored_in", ["en", "ko"])
def test_every_model_failure_sentence_is_read_back_in_either_language(kind: str, stored_in: str) -> None:
    detail = "Error code: 503 - {'error': 'upstream (2) busy'}"  # the provider's words: kept, numbers and all
    with translation.override(stored_in):
        stored = [
            f"{model_failure_text(kind)} {detail} {attempts_text(2)}",
            f"{model_failure_text(kind)} {attempts_text(1)}",
            f"{model_failure_text(kind)} {detail}",  # refused before any call was sent: no attempts
        ]
    for reader in ("en", "ko"):
        with translation.override(reader):
            expected = [
                f"{model_failure_text(kind)} {detail} {attempts_text(2)}",
                f"{model_failure_text(kind)} {attempts_text(1)}",
                f"{model_failure_text(kind)} {detail}",
            ]
            assert [error_message_text(f"model:{kind}", text) for text in stored] == expected


def test_a_model_failure_text_of_another_kind_or_of_no_sentence_stays_as_stored() -> None:
    with translation.override("ko"):
        korean = f"{model_failure_text('timeout')} {attempts_text(2)}"
    with translation.override("en"):
        assert error_message_text("model:connection", korean) == korean  # not the sentence its code says
        assert error_message_text("model:error", "boom") == "boom"


# --- 2. a file part's uri ----------------------------------------------------------------------------------------


def send(client: Client, *parts: dict[str, Any]) -> Any:
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "파일 확인"}, *parts]}
    return a2a(client, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})


@pytest.mark.parametrize(
    "url",
    [
        "http://x/ a",
        "https://x.example/a\tb",
        "https://x.example/a\x7fb",
        "javascript:alert(1)",
        "file:///etc/passwd",
        "no-scheme",
        "https://",
    ],
)
def test_a_file_part_whose_url_is_not_a_files_uri_is_refused(
    api_caller: ApiCaller, demo_agent: Agent, url: str
) -> None:
    client = caller_client(api_caller)
    answer = send(client, {"url": url})
    assert answer["error"]["code"] == -32602, answer
    assert '"parts": {"1": {"url": ' in answer["error"]["message"], answer  # the part, and its member
    rest = client.post(
        "/api/v1/runs",
        {"agent": "company-assistant", "query": "q", "files": [{"uri": url}]},
        "application/json",
    )
    assert rest.status_code == 400, rest.content
    assert rest.json()["error"]["fields"]["files"], rest.content
    assert Run.objects.count() == 0


def test_a_scheme_that_is_refused_is_named_with_those_taken(api_caller: ApiCaller, demo_agent: Agent) -> None:
    answer = send(caller_client(api_caller), {"url": "javascript:alert(1)"})
    assert "http, https, s3, gs, data" in answer["error"]["message"], answer


@pytest.mark.parametrize(
    "url",
    [
        "https://files.example/a.pdf",
        "HTTP://files.example/%20a.pdf",
        "s3://bucket/보고서.pdf",
        "data:text/plain;base64,aGk=",
    ],
)
def test_a_file_part_with_an_http_https_or_data_uri_makes_a_task(
    api_caller: ApiCaller, demo_agent: Agent, url: str
) -> None:
    answer = send(caller_client(api_caller), {"url": url, "filename": "a.pdf"})
    assert "result" in answer, answer
    run = Run.objects.get()
    assert run.a2a_files == [{"name": "a.pdf", "uri": url}]


# --- 3. MCP params that are no object ----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["tools/call", "initialize"])
@pytest.mark.parametrize("params", ["x", [], 3, None])
def test_mcp_params_that_are_no_object_are_refused(
    api_caller: ApiCaller, demo_agent: Agent, method: str, params: Any
) -> None:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    response = caller_client(api_caller).post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json"}
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32602, "message": "'params' must be an object."},
    }
    assert Run.objects.count() == 0


def test_mcp_methods_that_read_no_params_still_answer(api_caller: ApiCaller, demo_agent: Agent) -> None:
    client = caller_client(api_caller)
    for method in ("ping", "tools/list"):
        body = {"jsonrpc": "2.0", "id": 8, "method": method, "params": "x"}
        response = client.post(
            "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json"}
        )
        assert "result" in response.json(), response.content
