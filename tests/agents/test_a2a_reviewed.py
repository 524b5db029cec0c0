"""The A2A endpoint's defects from a review:

1. a decomposed (NFD) Korean ``contextId``, as macOS types it, was stored composed, then compared raw: a reply on
   the task with the same contextId was a -32602 ``context_mismatch`` and ``ListTasks`` by it found nothing;
2. a streaming call refused for want of a stream slot was answered with the REST error body, not JSON-RPC;
3. a ``messageId`` reused with another message was told about an ``Idempotency-Key`` the caller never sent;
4. a POST on an agent's card was refused 403 by the CSRF check instead of 405 with ``Allow: GET``.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.api.throttling import stream_slot_acquire, stream_slot_release
from agents.models import Agent, Approval, Run
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

RPC_URL = "/a2a/company-assistant/"
CONTEXT = "회의-7f3a"


def post_rpc(caller: ApiCaller, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client.post(RPC_URL, json.dumps(body), content_type="application/json")


def rpc(caller: ApiCaller, method: str, params: dict[str, Any]) -> Any:
    response = post_rpc(caller, method, params)
    assert response.status_code == 200, response.content
    return response.json()


def send(caller: ApiCaller, message: dict[str, Any]) -> Any:
    return rpc(caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})


def our_code(answer: dict[str, Any]) -> str:
    return str(answer["error"]["data"][0].get("metadata", {}).get("code", ""))


def park_for_input(run_id: str) -> Approval:
    """The run, as the engine leaves it once a call needs a person's approval."""
    run = Run.objects.get(pk=run_id)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    return Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="rule:1".ljust(64, "0"),
        call_id="rule:1",
        expires_at=timezone.now() + timedelta(hours=1),
    )


# --- 1. contextId compared composed --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_decomposed_context_id_answers_its_task_and_lists_it(api_caller: ApiCaller, demo_agent: Agent) -> None:
    decomposed = unicodedata.normalize("NFD", CONTEXT)
    assert decomposed != CONTEXT
    message = {"messageId": "m-nfd", "role": "ROLE_USER", "contextId": decomposed, "parts": [{"text": "메모 저장"}]}
    task = send(api_caller, message)["result"]["task"]
    assert task["contextId"] == CONTEXT  # stored (and reported) composed
    approval = park_for_input(task["id"])

    reply = {
        "messageId": "m-nfd-reject",
        "role": "ROLE_USER",
        "taskId": task["id"],
        "contextId": decomposed,
        "parts": [{"data": {"decision": "reject"}}],
    }
    answer = send(api_caller, reply)
    assert "error" not in answer, answer
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED

    for asked in (decomposed, CONTEXT):
        listed = rpc(api_caller, "ListTasks", {"contextId": asked})["result"]
        assert (listed["totalSize"], [t["id"] for t in listed["tasks"]]) == (1, [task["id"]])


@pytest.mark.slow
def test_a_reply_in_another_context_is_still_refused(api_caller: ApiCaller, demo_agent: Agent) -> None:
    message = {"messageId": "m-ctx", "role": "ROLE_USER", "contextId": CONTEXT, "parts": [{"text": "메모 저장"}]}
    task = send(api_caller, message)["result"]["task"]
    park_for_input(task["id"])
    reply = {"messageId": "m-ctx-2", "taskId": task["id"], "contextId": "회의-0000", "parts": [{"text": "approve"}]}
    answer = send(api_caller, reply)
    assert (answer["error"]["code"], our_code(answer)) == (-32602, "context_mismatch")


# --- 2. no free stream slot: a JSON-RPC error ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["SendStreamingMessage", "SubscribeToTask"])
def test_a_stream_refused_for_want_of_a_slot_is_a_json_rpc_error_in_a_429(
    api_caller: ApiCaller, demo_agent: Agent, settings: Any, method: str
) -> None:
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    message = {"messageId": "m-slot", "role": "ROLE_USER", "parts": [{"text": "메모 남겨줘"}]}
    params = (
        {"message": message} if method == "SendStreamingMessage" else {"id": "00000000-0000-0000-0000-000000000000"}
    )
    held = stream_slot_acquire(api_caller.key, lease_s=60)
    assert held is not None
    try:
        refused = post_rpc(api_caller, method, params)
    finally:
        stream_slot_release(held)
    assert refused.status_code == 429
    assert refused["Retry-After"] == "5"
    body = refused.json()
    assert (body["jsonrpc"], body["id"]) == ("2.0", "r1")
    error = body["error"]
    assert (error["code"], error["data"][0]["reason"], our_code(body)) == (
        -32029,
        "RESOURCE_EXHAUSTED",
        "too_many_streams",
    )
    assert "1 event streams open" in error["message"]
    assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"} in error["data"]
    assert not Run.objects.exists()  # refused before the message was submitted


# --- 3. a reused messageId is told in A2A's words ------------------------------------------------------------


def test_a_message_id_reused_with_another_message_names_the_message_id(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    first = {"messageId": "m-same", "role": "ROLE_USER", "parts": [{"text": "김하늘 님은?"}]}
    assert "error" not in send(api_caller, first)
    other = send(api_caller, {**first, "parts": [{"text": "박서준 님은?"}]})
    assert (other["error"]["code"], our_code(other)) == (-32602, "idempotency_key_reused")
    assert "messageId" in other["error"]["message"]
    assert "Idempotency-Key" not in other["error"]["message"]


def test_an_answer_id_reused_with_another_answer_names_the_message_id(api_caller: ApiCaller, demo_agent: Agent) -> None:
    task = send(api_caller, {"messageId": "m-q", "role": "ROLE_USER", "parts": [{"text": "메모 저장"}]})["result"]
    park_for_input(task["task"]["id"])
    answer = {"messageId": "m-answer", "taskId": task["task"]["id"], "parts": [{"text": "approve"}]}
    assert "error" not in send(api_caller, answer)
    other = send(api_caller, {**answer, "parts": [{"text": "reject"}]})
    assert (other["error"]["code"], our_code(other)) == (-32602, "idempotency_key_reused")
    assert "messageId" in other["error"]["message"]
    assert "Idempotency-Key" not in other["error"]["message"]


# --- 4. a POST on a card: 405 -------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/a2a/company-assistant/.well-known/agent-card.json", "/.well-known/agent-card.json"])
def test_a_post_on_a_card_is_405_allowing_get_not_a_csrf_refusal(
    api_caller: ApiCaller, demo_agent: Agent, url: str
) -> None:
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    response = client.post(url, "{}", content_type="application/json")
    assert response.status_code == 405, response.content
    assert response["Allow"] == "GET"
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert client.get(url).status_code == 200
