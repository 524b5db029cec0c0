"""A task's state as the A2A endpoint tells it (s47): a run parked for approval whose every pending approval is
past its expiry (the reconciler has not marked them yet) was ``TASK_STATE_INPUT_REQUIRED`` with "Approval needed
before these calls: ." and an empty list, though nothing could be approved (an answer was refused as expired);
``ListTasks`` counted it as waiting for input, and a stream or a blocking ``SendMessage`` ended on it. It goes on
once the reconciler expires them: its task is ``TASK_STATE_WORKING`` until then, and a stream follows it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent, Approval, Run, RunEvent
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def quiet(db: Any) -> Agent:
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def parked(agent: Agent, caller: ApiCaller, *, expires_in: timedelta) -> Run:
    run = Run.objects.create(agent=agent, api_key=caller.key, query="회의록 저장", status=Run.Status.AWAITING_APPROVAL)
    Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="a" * 64,
        call_id="rule:1",
        expires_at=timezone.now() + expires_in,
    )
    return run


def rpc(caller: ApiCaller, method: str, params: dict[str, Any]) -> Any:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    body = json.dumps({"jsonrpc": "2.0", "id": "t1", "method": method, "params": params})
    return client.post("/a2a/quiet/", body, content_type="application/json", headers={"A2A-Version": "1.0"})


def task_of(caller: ApiCaller, run: Run) -> dict[str, Any]:
    response = rpc(caller, "GetTask", {"id": str(run.pk)})
    assert response.status_code == 200
    return response.json()["result"]


def test_a_task_whose_approvals_all_lapsed_is_working_and_asks_for_nothing(api_caller: ApiCaller, quiet: Agent) -> None:
    lapsed = parked(quiet, api_caller, expires_in=timedelta(seconds=-5))
    task = task_of(api_caller, lapsed)
    assert task["status"]["state"] == "TASK_STATE_WORKING"
    [part] = task["status"]["message"]["parts"]
    assert "Approval needed" not in part["text"] and "not approved in time" in part["text"]


def test_a_task_with_an_approval_still_to_decide_asks_for_it(api_caller: ApiCaller, quiet: Agent) -> None:
    waiting = parked(quiet, api_caller, expires_in=timedelta(hours=1))
    task = task_of(api_caller, waiting)
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    text, data = task["status"]["message"]["parts"]
    assert 'append_note {"text": "회의록"}' in text["text"]
    assert [a["tool"] for a in data["data"]["approvals"]] == ["append_note"]


def test_list_tasks_filters_by_the_state_each_task_shows(api_caller: ApiCaller, quiet: Agent) -> None:
    lapsed = parked(quiet, api_caller, expires_in=timedelta(seconds=-5))
    waiting = parked(quiet, api_caller, expires_in=timedelta(hours=1))
    running = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.RUNNING)

    def listed(state: str) -> set[str]:
        answer = rpc(api_caller, "ListTasks", {"status": state}).json()["result"]
        assert answer["totalSize"] == len(answer["tasks"])
        assert {t["status"]["state"] for t in answer["tasks"]} <= {state}
        return {t["id"] for t in answer["tasks"]}

    assert listed("TASK_STATE_INPUT_REQUIRED") == {str(waiting.pk)}
    assert listed("TASK_STATE_WORKING") == {str(lapsed.pk), str(running.pk)}


def test_a_stream_of_a_task_whose_approvals_lapsed_follows_it_to_its_end(
    api_caller: ApiCaller, quiet: Agent, settings: Any
) -> None:
    settings.PLATFORM_SSE_POLL_S = 0
    settings.PLATFORM_SSE_MAX_S = 30  # bounds the stream where it is not followed
    lapsed = parked(quiet, api_caller, expires_in=timedelta(seconds=-5))
    response = rpc(api_caller, "SubscribeToTask", {"id": str(lapsed.pk)})
    assert response.status_code == 200 and response.streaming, response.content
    chunks = iter(response.streaming_content)
    first = json.loads(next(chunks).decode()[len("data: ") :])
    assert first["result"]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    # The reconciler expires the approval and the run goes on without the call, to its answer.
    Approval.objects.filter(run=lapsed).update(status=Approval.Status.EXPIRED)
    RunEvent.objects.create(run=lapsed, seq=1, kind="status", data={"status": "queued"})
    Run.objects.filter(pk=lapsed.pk).update(status=Run.Status.SUCCEEDED, answer="저장하지 않았습니다")
    rest = b"".join(chunks).decode()
    sent = [json.loads(line[len("data: ") :]) for line in rest.splitlines() if line.startswith("data: ")]
    assert sent[-1]["result"]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "저장하지 않았습니다" in rest
