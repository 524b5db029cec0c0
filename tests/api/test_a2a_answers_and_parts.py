"""The A2A endpoint's answers to a task waiting for input, its message parts, ``ListTasks``' contextId filter and
``returnImmediately``. Defects held here:

1. a reply resent under the same ``messageId`` (a client's retry) was answered -32602 ``run_not_waiting`` while the
   first had been applied, and, once the run parked again for another call, approved that call, which the person
   never saw; a replay now returns the task and decides nothing;
2. "approve" with several calls pending decided them one by one: the first was approved and the run queued again,
   then the second (a model's write the caller may not approve) was refused; now all of them or none;
3. a part's members other than its content (an unknown one, ``metadata`` or ``filename`` of the wrong type) were
   dropped unchecked, where ``POST /api/v1/runs`` refuses them;
4. ``ListTasks(contextId=X)`` missed the task whose reported contextId is X because its run keeps none (its id);
5. ``configuration.returnImmediately`` took any truthy value ("false") for yes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent, Approval, Run
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def rpc(caller: ApiCaller, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    response = client.post("/a2a/company-assistant/", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def send(caller: ApiCaller, message: dict[str, Any]) -> Any:
    return rpc(caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})


def our_code(answer: dict[str, Any]) -> str:
    return str(answer["error"]["data"][0].get("metadata", {}).get("code", ""))


def parked(agent: Agent, caller: ApiCaller) -> Run:
    return Run.objects.create(agent=agent, api_key=caller.key, query="메모 저장", status=Run.Status.AWAITING_APPROVAL)


def pending(run: Run, call_id: str, text: str) -> Approval:
    return Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": text},
        call_hash=call_id.ljust(64, "0")[:64],
        call_id=call_id,
        expires_at=timezone.now() + timedelta(hours=1),
    )


@pytest.mark.parametrize("parts", [[{"text": "approve"}], [{"data": {"decision": "approve"}}]])
def test_a_resent_answer_returns_the_task_and_never_decides_a_call_pending_since(
    api_caller: ApiCaller, demo_agent: Agent, parts: list[dict[str, Any]]
) -> None:
    run = parked(demo_agent, api_caller)
    first = pending(run, "rule:1", "회의록")
    message = {"messageId": "m-1", "role": "ROLE_USER", "taskId": str(run.pk), "parts": parts}

    answer = send(api_caller, message)
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    first.refresh_from_db()
    assert first.status == Approval.Status.APPROVED
    decided_at = first.decided_at

    # Resent while the run is queued again: the same task, not "not waiting" (the first was applied).
    again = send(api_caller, message)
    assert "error" not in again, again
    assert again["result"]["task"]["id"] == str(run.pk)
    first.refresh_from_db()
    assert first.decided_at == decided_at

    # Resent once the run parked again for another call: that call is not approved by it.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    second = pending(run, "rule:2", "새 호출")
    replay = send(api_caller, message)
    assert replay["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    second.refresh_from_db()
    assert second.status == Approval.Status.PENDING

    # Another message under that messageId is refused; a new messageId decides the call it sees.
    other = send(api_caller, {**message, "parts": [{"text": "reject"}]})
    assert (other["error"]["code"], our_code(other)) == (-32602, "idempotency_key_reused")
    send(api_caller, {**message, "messageId": "m-2"})
    second.refresh_from_db()
    assert second.status == Approval.Status.APPROVED


def test_approving_every_pending_call_decides_none_when_one_may_not_be_approved(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    """A rule's call (the caller may approve it) and a model's write (a reviewer must, on this agent): the rule's
    was approved and the run queued again before the model's was refused."""
    assert not demo_agent.caller_approves_model_writes
    run = parked(demo_agent, api_caller)
    rule_call = pending(run, "rule:1", "회의록")
    model_call = pending(run, "call_1", "모델이 쓴 메모")
    message = {"messageId": "m-all", "role": "ROLE_USER", "taskId": str(run.pk), "parts": [{"text": "approve"}]}

    answer = send(api_caller, message)
    assert (answer["error"]["code"], our_code(answer)) == (-32031, "approval_needs_reviewer")
    assert str(model_call.pk) in answer["error"]["message"]
    for approval in (rule_call, model_call):
        approval.refresh_from_db()
        assert approval.status == Approval.Status.PENDING
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert not run.events.exists()  # no "queued" status, no recorded answer

    # Nothing was recorded under the messageId: once the model's call is rejected, the same answer decides.
    reject = {"messageId": "m-reject", "role": "ROLE_USER", "taskId": str(run.pk)}
    send(api_caller, {**reject, "parts": [{"data": {"decision": "reject", "approvalId": str(model_call.pk)}}]})
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    assert "error" not in send(api_caller, message)
    rule_call.refresh_from_db()
    assert rule_call.status == Approval.Status.APPROVED


@pytest.mark.parametrize(
    ("part", "member"),
    [
        ({"text": "q", "zzz": 1}, "zzz"),
        ({"kind": "text", "text": "q", "zzz": 1}, "zzz"),
        ({"text": "q", "metadata": "m"}, "metadata"),
        ({"text": "q", "filename": 5}, "filename"),
    ],
)
def test_a_part_member_the_runs_api_refuses_is_refused_here_too(
    api_caller: ApiCaller, api_client: Any, demo_agent: Agent, part: dict[str, Any], member: str
) -> None:
    rest = api_client.post(
        "/api/v1/runs", {"agent": demo_agent.slug, "message": {"role": "user", "parts": [part]}}, format="json"
    )
    assert rest.status_code == 400
    answer = send(api_caller, {"messageId": "m-p", "role": "ROLE_USER", "parts": [part]})
    assert answer["error"]["code"] == -32602, answer
    assert member in answer["error"]["message"]
    assert not Run.objects.exists()


def test_a_part_with_its_optional_members_well_formed_still_starts_a_run(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    parts = [{"text": "김하늘 님은?", "metadata": {"source": "챗봇"}, "mediaType": "text/plain"}, {"data": "값"}]
    answer = send(api_caller, {"messageId": "m-ok", "role": "ROLE_USER", "parts": parts})
    run = Run.objects.get(pk=answer["result"]["task"]["id"])
    assert run.query == "김하늘 님은?" and run.a2a_data == [{"value": "값"}]


def test_listing_by_a_context_finds_the_task_whose_context_is_its_own_id(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    alone = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", context={"userId": "u1"})
    follow_up = Run.objects.create(
        agent=demo_agent, api_key=api_caller.key, query="q", context={"contextId": str(alone.pk)}
    )
    elsewhere = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", context={"contextId": "대화-1"})
    tasks = rpc(api_caller, "ListTasks", {"contextId": str(alone.pk)})["result"]["tasks"]
    assert {t["id"] for t in tasks} == {str(alone.pk), str(follow_up.pk)}
    assert {t["contextId"] for t in tasks} == {str(alone.pk)}
    # A run's id is not its context where it keeps another.
    assert rpc(api_caller, "ListTasks", {"contextId": str(elsewhere.pk)})["result"]["tasks"] == []
    assert [t["id"] for t in rpc(api_caller, "ListTasks", {"contextId": "대화-1"})["result"]["tasks"]] == [
        str(elsewhere.pk)
    ]


@pytest.mark.parametrize("value", ["false", "true", 0, 1, [], {}])
def test_return_immediately_must_be_a_boolean(api_caller: ApiCaller, demo_agent: Agent, value: Any) -> None:
    message = {"messageId": "m-ri", "role": "ROLE_USER", "parts": [{"text": "김하늘 님은?"}]}
    answer = rpc(api_caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": value}})
    assert answer["error"]["code"] == -32602 and "returnImmediately" in answer["error"]["message"]
    assert not Run.objects.exists()
