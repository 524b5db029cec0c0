"""The A2A, MCP and REST doors against a reviewer's findings on a live platform:

1. a ``contextId`` that looks like a secret (``sk-…``, ``ghp_…``, ``AKIA…``, ``password=…``) was stored masked as
   "***": every such conversation of a key became one, each run was given the others' history, and ``ListTasks``
   by the real id found nothing. It is refused on every door, naming ``contextId``;
2. answering an input-required task over ``SendStreamingMessage`` sent the task (WORKING) and then the answer's
   own "queued" (SUBMITTED, stamped earlier): the task went back in time;
3. a blocking ``SendMessage`` (and ``POST /runs?wait=N``) of a key revoked while it waited still got the answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.api import views
from agents.models import Agent, Approval, Run
from agents.run_state import RunEventWriter
from agents.services import api_key_revoke
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

SECRET_LOOKING = [
    "sk-alpha-11111111",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "AKIAIOSFODNN7EXAMPLE",
    "conv password=hunter2",
]
REFUSAL = "looks like a secret"


@pytest.fixture
def quiet(db: Any) -> Agent:
    """An agent without servers or rules: its runs stay queued (no worker runs in these tests)."""
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


@pytest.fixture(autouse=True)
def fast_streams(settings: Any) -> Any:
    """Quick polls, keep-alives and key checks; a wait that ends by time (``PLATFORM_API_MAX_WAIT_S``) still answers
    as the tests expect (the key is checked once more before the task is sent), so no test tells the two apart, and
    a message the old code took instead of refusing is answered in seconds, not a minute."""
    settings.PLATFORM_SSE_POLL_S = 0.05
    settings.PLATFORM_SSE_KEEPALIVE_S = 0.1
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 0.2
    settings.PLATFORM_SSE_MAX_S = 600
    settings.PLATFORM_API_MAX_WAIT_S = 3
    return settings


def client_for(raw_key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")


def a2a(client: Client, slug: str, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    return client.post(
        f"/a2a/{slug}/", json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0"}
    )


def answered(response: Any) -> dict[str, Any]:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    result: dict[str, Any] = json.loads(body)
    return result


def message(text: str, **envelope: Any) -> dict[str, Any]:
    return {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}], **envelope}


def rest_of(chunks: Iterator[bytes], *, hang_s: float = 60) -> bytes:
    """The rest of a body that must end by itself; one still open after ``hang_s`` fails the test (a bound on a
    hang, not a speed check)."""
    deadline = time.monotonic() + hang_s
    received: list[bytes] = []
    for chunk in chunks:
        received.append(chunk)
        if time.monotonic() > deadline:
            pytest.fail(f"the body did not end: ...{b''.join(received)[-400:]!r}")
    return b"".join(received)


def sse_data(text: str) -> list[Any]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def finish(run_id: Any, answer: str) -> None:
    """The run as a worker leaves a succeeded one: its last status event, then the run (no worker runs here)."""
    RunEventWriter(run_id=run_id, secrets=[]).emit("status", {"status": "succeeded", "answer": answer, "error": None})
    now = timezone.now()
    Run.objects.filter(pk=run_id).update(status=Run.Status.SUCCEEDED, answer=answer, finished_at=now)


# --- 1. a contextId that looks like a secret is refused, never stored masked ----------------------------------


@pytest.mark.parametrize("context_id", SECRET_LOOKING)
def test_rest_refuses_a_context_id_that_looks_like_a_secret_naming_the_field(
    api_caller: ApiCaller, quiet: Agent, context_id: str
) -> None:
    client = client_for(api_caller.raw_key)
    for body in (
        {"agent": "quiet", "query": "q", "context": {"contextId": context_id}},
        {
            "agent": "quiet",
            "message": {"role": "user", "parts": [{"kind": "text", "text": "q"}], "contextId": context_id},
        },
    ):
        response = client.post("/api/v1/runs", body, content_type="application/json")
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["code"] == "invalid_input" and REFUSAL in error["message"]
        assert list(error["fields"]) == ["context"] and list(error["fields"]["context"]) == ["contextId"]
        assert context_id not in response.content.decode()  # the refusal does not echo the secret
    assert not Run.objects.exists()


@pytest.mark.parametrize("context_id", SECRET_LOOKING)
def test_a2a_and_mcp_refuse_a_context_id_that_looks_like_a_secret(
    api_caller: ApiCaller, quiet: Agent, context_id: str
) -> None:
    client = client_for(api_caller.raw_key)
    for params in (
        {"message": message("alpha", contextId=context_id)},
        {"message": message("beta"), "metadata": {"context": {"contextId": context_id}}},
    ):
        error = answered(a2a(client, "quiet", "SendMessage", params))["error"]
        assert error["code"] == -32602 and REFUSAL in error["message"]
        assert error["data"][0]["metadata"]["code"] == "invalid_input"
    call = {"name": "ask_quiet", "arguments": {"query": "q", "context": {"contextId": context_id}}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
    response = client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json"}
    )
    result = answered(response)["result"]
    assert result["isError"] is True and result["content"][0]["text"].startswith("invalid_input: ")
    assert not Run.objects.exists()


def test_two_conversations_of_one_key_stay_two_and_are_found_by_their_own_ids(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    client = client_for(api_caller.raw_key)
    immediately = {"configuration": {"returnImmediately": True}}
    for context_id in ("alpha-11111111", "beta-222222222"):
        task = answered(
            a2a(client, "quiet", "SendMessage", {"message": message(context_id, contextId=context_id), **immediately})
        )
        assert task["result"]["task"]["contextId"] == context_id
        listed = answered(a2a(client, "quiet", "ListTasks", {"contextId": context_id}))["result"]
        assert [t["id"] for t in listed["tasks"]] == [task["result"]["task"]["id"]]


# --- 2. an answer's stream never goes back in time ------------------------------------------------------------


def test_answering_input_over_a_stream_sends_no_state_older_than_the_task(
    api_caller: ApiCaller, demo_agent: Agent, fast_streams: Any
) -> None:
    client = client_for(api_caller.raw_key)
    sent = answered(
        a2a(
            client,
            "company-assistant",
            "SendMessage",
            {"message": message("메모 저장"), "configuration": {"returnImmediately": True}},
        )
    )
    task = sent["result"]["task"]
    writer = RunEventWriter(run_id=task["id"], secrets=[])
    writer.emit("status", {"status": "running", "delivery": 1})
    writer.emit("status", {"status": "awaiting_approval", "answer": "", "error": None})
    Run.objects.filter(pk=task["id"]).update(status=Run.Status.AWAITING_APPROVAL, started_at=timezone.now())
    Approval.objects.create(
        run_id=task["id"],
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="rule:1".ljust(64, "0"),
        call_id="rule:1",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    answer = {
        "messageId": "m-approve",
        "role": "ROLE_USER",
        "taskId": task["id"],
        "contextId": task["contextId"],
        "parts": [{"data": {"decision": "approve", "reason": "좋아요"}}],
    }
    response = a2a(client, "company-assistant", "SendStreamingMessage", {"message": answer})
    assert response["Content-Type"].startswith("text/event-stream")
    # The answer queued the run again (its "queued" event); a worker takes it before the stream's first read.
    assert Run.objects.get(pk=task["id"]).status == Run.Status.QUEUED
    RunEventWriter(run_id=task["id"], secrets=[]).emit("status", {"status": "running", "delivery": 2})
    Run.objects.filter(pk=task["id"]).update(status=Run.Status.RUNNING)
    chunks = iter(response.streaming_content)
    first = sse_data(next(chunks).decode())
    assert first[0]["result"]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    finish(task["id"], "저장했습니다.")
    events = first + sse_data(rest_of(chunks).decode())
    states = [
        event["result"]["task"]["status"] if "task" in event["result"] else event["result"]["statusUpdate"]["status"]
        for event in events
        if "task" in event["result"] or "statusUpdate" in event["result"]
    ]
    assert [s["state"] for s in states] == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    stamps = [s["timestamp"] for s in states]
    assert stamps == sorted(stamps)


# --- 3. a wait of a key revoked meanwhile ends with the key's error, not the answer ---------------------------


def test_a_blocking_send_message_of_a_key_revoked_while_it_waits_ends_unauthenticated(
    api_caller: ApiCaller, quiet: Agent, fast_streams: Any
) -> None:
    response = a2a(client_for(api_caller.raw_key), "quiet", "SendMessage", {"message": message("hello")})
    chunks = iter(response.streaming_content)
    assert next(chunks) == b" "
    api_key_revoke(api_key=api_caller.key, actor="test", via="tests")
    last = json.loads(rest_of(chunks))
    assert last["id"] == "r1" and "result" not in last
    assert last["error"]["code"] == -32030
    assert last["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
    assert last["error"]["data"][0]["metadata"]["code"] == "authentication_failed"
    assert Run.objects.get().status == Run.Status.QUEUED  # the task goes on


def test_a_task_finished_after_its_key_was_revoked_is_not_sent_to_the_blocking_caller(
    api_caller: ApiCaller, quiet: Agent, fast_streams: Any
) -> None:
    fast_streams.PLATFORM_SSE_AUTH_RECHECK_S = 15  # no periodic check falls due: the check before the answer
    response = a2a(client_for(api_caller.raw_key), "quiet", "SendMessage", {"message": message("hello")})
    chunks = iter(response.streaming_content)
    assert next(chunks) == b" "
    api_key_revoke(api_key=api_caller.key, actor="test", via="tests")
    finish(Run.objects.get().pk, "the secret plan")
    body = rest_of(chunks)
    assert b"the secret plan" not in body
    assert json.loads(body)["error"]["code"] == -32030


def test_a_blocking_send_message_of_a_live_key_still_gets_its_task(
    api_caller: ApiCaller, quiet: Agent, fast_streams: Any
) -> None:
    response = a2a(client_for(api_caller.raw_key), "quiet", "SendMessage", {"message": message("hello")})
    chunks = iter(response.streaming_content)
    assert next(chunks) == b" "
    finish(Run.objects.get().pk, "안녕하세요")
    task = json.loads(rest_of(chunks))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["text"] == "안녕하세요"


def wait_then(monkeypatch: pytest.MonkeyPatch, *, revoke: ApiCaller | None) -> None:
    """``POST /runs?wait`` with the run finished while it waits, and the key revoked meanwhile if ``revoke``
    (the interleaving patched in: the view waits on the test's own thread)."""
    real_wait = views.run_wait

    def waited(*, run: Run, timeout_s: float) -> Run:
        if run.status == Run.Status.QUEUED:
            if revoke is not None:
                api_key_revoke(api_key=revoke.key, actor="test", via="tests")
            finish(run.pk, "the secret plan")
        return real_wait(run=run, timeout_s=timeout_s)

    monkeypatch.setattr(views, "run_wait", waited)


def test_rest_wait_of_a_key_revoked_while_it_waits_is_401_without_the_run(
    api_caller: ApiCaller, quiet: Agent, fast_streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_then(monkeypatch, revoke=api_caller)
    body = {"agent": "quiet", "query": "q"}
    response = client_for(api_caller.raw_key).post("/api/v1/runs?wait=2", body, content_type="application/json")
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "authentication_failed"
    assert b"the secret plan" not in response.content


def test_rest_wait_of_a_live_key_still_answers_the_finished_run(
    api_caller: ApiCaller, quiet: Agent, fast_streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_then(monkeypatch, revoke=None)
    body = {"agent": "quiet", "query": "q"}
    response = client_for(api_caller.raw_key).post("/api/v1/runs?wait=2", body, content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["answer"] == "the secret plan"
