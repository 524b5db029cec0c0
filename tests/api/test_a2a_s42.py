"""The A2A endpoint's answers to a task waiting for input, its part bound, its rate limit and its charset. Defects
held here:

1. an answer to a task whose every pending approval was past its expiry (the sweep not yet run) was a success that
   decided nothing, recorded under its messageId (a retry then did nothing), the approval left pending; a decision
   that decides nothing (``null``, ``"maybe"``) was accepted there too. REST answers 409 and resumes the run;
2. an answer's parts were not checked (an unknown member, a part that is not an object, two contents);
3. the 100-part bound was checked only once every part had been read;
4. an answer's ``metadata.context.contextId`` naming another conversation was ignored;
5. a key over its rate limit got the REST API's error body on ``/a2a/``, not JSON-RPC;
6. a body declared in another charset than UTF-8 was read all the same (REST and MCP answer 415).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent, ApiKey, Approval, Run, RunEvent
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

A2A = "/a2a/company-assistant/"


def post(caller: ApiCaller, body: Any, content_type: str = "application/json") -> Any:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client.post(A2A, json.dumps(body), content_type=content_type)


def send(caller: ApiCaller, message: dict[str, Any], **params: Any) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": "r1",
        "method": "SendMessage",
        "params": {"message": message, "configuration": {"returnImmediately": True}, **params},
    }
    response = post(caller, body)
    assert response.status_code == 200, response.content
    return response.json()


def our_code(answer: dict[str, Any]) -> tuple[int, str]:
    error = answer["error"]
    return error["code"], str(error["data"][0].get("metadata", {}).get("code", ""))


def parked(agent: Agent, caller: ApiCaller) -> Run:
    return Run.objects.create(agent=agent, api_key=caller.key, query="메모 저장", status=Run.Status.AWAITING_APPROVAL)


def pending(run: Run, text: str, expires: timedelta = timedelta(hours=1)) -> Approval:
    return Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": text},
        call_hash="rule:1".ljust(64, "0"),
        call_id="rule:1",
        expires_at=timezone.now() + expires,
    )


def answers(run: Run) -> int:
    return RunEvent.objects.filter(run_id=run.pk, kind="approval_answer").count()


def test_an_answer_when_every_approval_is_past_its_expiry_expires_it_and_is_refused_as_rest_does(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run = parked(demo_agent, api_caller)
    approval = pending(run, "x", expires=timedelta(seconds=-5))
    answer = send(
        api_caller, {"messageId": "e1", "role": "ROLE_USER", "taskId": str(run.pk), "parts": [{"text": "승인"}]}
    )
    assert our_code(answer) == (-32602, "approval_expired"), answer
    approval.refresh_from_db()
    run.refresh_from_db()
    # As POST /runs/{id}/approvals/{id} leaves them: the approval expired, the run queued again (the model is told).
    assert (approval.status, run.status) == (Approval.Status.EXPIRED, Run.Status.QUEUED)
    assert answers(run) == 0  # nothing decided, nothing recorded for a retry to find

    rest_run = parked(demo_agent, api_caller)
    rest_approval = pending(rest_run, "y", expires=timedelta(seconds=-5))
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    rest = client.post(
        f"/api/v1/runs/{rest_run.pk}/approvals/{rest_approval.pk}", {"decision": "approve"}, "application/json"
    )
    assert (rest.status_code, rest.json()["error"]["code"]) == (409, "approval_expired")


@pytest.mark.parametrize("decision", [None, "maybe", "APPROVE"])
def test_a_decision_that_decides_nothing_is_refused_even_where_no_call_is_left_to_decide(
    api_caller: ApiCaller, demo_agent: Agent, decision: Any
) -> None:
    run = parked(demo_agent, api_caller)
    approval = pending(run, "x", expires=timedelta(seconds=-5))
    message = {
        "messageId": "d1",
        "role": "ROLE_USER",
        "taskId": str(run.pk),
        "parts": [{"data": {"decision": decision}}],
    }
    answer = send(api_caller, message)
    assert our_code(answer) == (-32602, "invalid_input"), answer
    assert "decision" in answer["error"]["message"]
    approval.refresh_from_db()
    run.refresh_from_db()
    assert (approval.status, run.status, answers(run)) == (Approval.Status.PENDING, Run.Status.AWAITING_APPROVAL, 0)


@pytest.mark.parametrize(
    "parts",
    [
        [{"text": "approve", "bogus": 1, "data": 5}],
        ["junk", {"text": "승인", "metadata": "notobj"}],
        [{"text": "승인", "metadata": "notobj"}],
        [{"text": "approve", "bogus": 1}],
        [{"text": "approve", "data": {"decision": "reject"}}],
    ],
)
def test_an_answers_parts_are_checked_as_a_new_messages_are(
    api_caller: ApiCaller, demo_agent: Agent, parts: list[Any]
) -> None:
    run = parked(demo_agent, api_caller)
    approval = pending(run, "x")
    answer = send(api_caller, {"messageId": "p1", "role": "ROLE_USER", "taskId": str(run.pk), "parts": parts})
    assert answer["error"]["code"] == -32602, answer
    fresh = send(api_caller, {"messageId": "p2", "role": "ROLE_USER", "parts": parts})
    assert fresh["error"]["code"] == -32602, fresh  # the same refusal a new message gets
    approval.refresh_from_db()
    assert (approval.status, answers(run)) == (Approval.Status.PENDING, 0)


@pytest.mark.parametrize("answering", [False, True])
def test_a_message_over_the_part_bound_is_refused_before_any_part_is_read(
    api_caller: ApiCaller, demo_agent: Agent, answering: bool
) -> None:
    run = parked(demo_agent, api_caller)
    approval = pending(run, "x")
    # The first part is bad: read first, it was the answer; the count is told, as the REST API tells it.
    parts: list[Any] = ["not a part"] + [{"text": "approve"}] * 100
    message: dict[str, Any] = {"messageId": "m1", "role": "ROLE_USER", "parts": parts}
    if answering:
        message["taskId"] = str(run.pk)
    answer = send(api_caller, message)
    assert answer["error"]["code"] == -32602, answer
    assert "no more than 100" in answer["error"]["message"], answer
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert Run.objects.count() == 1


def test_an_answer_whose_metadata_context_names_another_conversation_is_refused(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run = parked(demo_agent, api_caller)
    approval = pending(run, "x")
    message = {"messageId": "q1", "role": "ROLE_USER", "taskId": str(run.pk), "parts": [{"text": "approve"}]}
    answer = send(api_caller, message, metadata={"context": {"contextId": "someone-elses-conversation"}})
    assert our_code(answer) == (-32602, "context_mismatch"), answer
    approval.refresh_from_db()
    assert (approval.status, answers(run)) == (Approval.Status.PENDING, 0)
    # Its own conversation (the task's id, as the task reports it) is taken.
    own = send(api_caller, message, metadata={"context": {"contextId": str(run.pk)}})
    assert own["result"]["task"]["id"] == str(run.pk), own
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED


def test_a_key_over_its_rate_limit_is_answered_in_json_rpc(api_caller: ApiCaller, demo_agent: Agent) -> None:
    ApiKey.objects.filter(pk=api_caller.key.pk).update(rate="2/min")
    body = {"jsonrpc": "2.0", "id": "t-9", "method": "GetTask", "params": {"id": "x"}}
    for _ in range(2):
        assert post(api_caller, body).status_code == 200
    response = post(api_caller, body)
    assert response.status_code == 429, response.content
    wait = int(response["Retry-After"])
    assert 1 <= wait <= 60
    answer = response.json()
    assert (answer["jsonrpc"], answer["id"]) == ("2.0", "t-9")
    assert our_code(answer) == (-32029, "throttled")
    assert answer["error"]["data"][0]["reason"] == "RESOURCE_EXHAUSTED"
    assert answer["error"]["data"][1]["retryDelay"] == f"{wait}s"


def test_a_body_declared_in_another_charset_than_utf8_is_a_415(api_caller: ApiCaller, demo_agent: Agent) -> None:
    message = {"messageId": "c1", "role": "ROLE_USER", "parts": [{"text": "안녕"}]}
    params: dict[str, Any] = {"message": message}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    response = post(api_caller, body, content_type="application/json; charset=latin-1")
    assert response.status_code == 415, response.content
    assert response.json()["error"]["code"] == -32600
    assert not Run.objects.exists()
    ok = post(api_caller, {**body, "params": {**params, "configuration": {"returnImmediately": True}}})
    assert ok.status_code == 200 and ok.json()["result"]["task"]["id"]
    utf8 = post(
        api_caller,
        {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "x"}},
        "application/json; charset=UTF-8",
    )
    assert utf8.status_code == 200 and utf8.json()["error"]["code"] == -32001
