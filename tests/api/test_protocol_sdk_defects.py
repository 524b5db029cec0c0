"""The A2A and MCP endpoints against what a reviewer found driving them with the official SDK clients (a2a-sdk,
mcp):

1. a blocking ``SendMessage`` sent nothing while it waited (up to ``PLATFORM_API_MAX_WAIT_S``), so the SDK's 5 s
   read timeout fired before the client learnt the task's id: the body now starts at once and is kept alive with
   JSON's whitespace, errors found before the wait keeping their HTTP status;
2. a task's status timestamp was its run's first start: an input-required task was stamped before the tool calls
   that led to it, a task queued again went back in time, and ``ListTasks(statusTimestampAfter)`` missed both;
3. an MCP ``notifications/cancelled`` that reached another web process (no shared cache) was lost;
4. what the servers say of themselves (the MCP instructions, tool descriptions and input schema; the A2A directory
   card, default skill and security scheme) was English whatever the caller's language;
5. an MCP result waiting for approvals did not name the approvals' ids in its text; ``ListTasks`` refused an A2A
   state the platform never reports; ``DELETE /mcp/`` answered 204 to anyone while the session went on working.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.test import Client
from django.utils import timezone, translation

from agents.api import a2a_server, mcp_server
from agents.api.mcp_server import call_result
from agents.models import Agent, Approval, Run, RunEvent
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

A2A = "/a2a/quiet/"


@pytest.fixture
def quiet(db: Any) -> Agent:
    """An agent without servers or rules: its runs stay queued (no worker runs in these tests)."""
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def client_for(raw_key: str, **extra: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}", **extra)


def a2a(client: Client, method: str, params: dict[str, Any], rpc_id: Any = "r1") -> Any:
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}
    return client.post(A2A, json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0"})


def mcp(client: Client, method: str, params: dict[str, Any] | None = None, *, rpc_id: Any = 1, **headers: str) -> Any:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if rpc_id is not None:
        body["id"] = rpc_id
    return client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json", **headers}
    )


def rest_of(chunks: Iterator[bytes], *, hang_s: float = 30) -> bytes:
    """The rest of a body that must end by itself; one still open after ``hang_s`` fails the test (a bound on a
    hang, not a speed check)."""
    deadline = time.monotonic() + hang_s
    received: list[bytes] = []
    for chunk in chunks:
        received.append(chunk)
        if time.monotonic() > deadline:
            pytest.fail(f"the body did not end: ...{b''.join(received)[-400:]!r}")
    return b"".join(received)


@pytest.fixture
def fast_waits(settings: Any) -> Any:
    settings.PLATFORM_SSE_POLL_S = 0.02
    settings.PLATFORM_SSE_KEEPALIVE_S = 0.05
    settings.PLATFORM_API_MAX_WAIT_S = 5  # bounds the old code's silent wait; the tests end the run before it
    return settings


# --- 1. a blocking SendMessage starts its body at once ---------------------------------------------------------


def test_a_blocking_send_message_answers_at_once_with_whitespace_until_the_task_is_ready(
    api_caller: ApiCaller, quiet: Agent, fast_waits: Any
) -> None:
    message = {"messageId": "m-wait", "role": "ROLE_USER", "parts": [{"text": "김하늘 님은 어느 팀인가요?"}]}
    response = a2a(client_for(api_caller.raw_key), "SendMessage", {"message": message})
    assert response.status_code == 200
    assert response.streaming, "the answer waited in silence"
    assert response["Content-Type"].startswith("application/json")
    chunks = iter(response.streaming_content)
    assert next(chunks) == b" "  # at once, while the run is still queued
    assert next(chunks) == b" "  # and again at the keep-alive, while it still is
    run = Run.objects.get()
    assert run.status == Run.Status.QUEUED
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.SUCCEEDED, answer="인사팀입니다.", started_at=timezone.now(), finished_at=timezone.now()
    )
    answer = json.loads(rest_of(chunks))
    assert (answer["jsonrpc"], answer["id"]) == ("2.0", "r1")
    task = answer["result"]["task"]
    assert task["id"] == str(run.pk)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["text"] == "인사팀입니다."


def test_an_error_found_before_the_wait_keeps_its_status_and_is_not_a_body_held_open(
    api_caller: ApiCaller, quiet: Agent, fast_waits: Any
) -> None:
    message = {"messageId": "m-bad", "role": "ROLE_USER", "parts": []}
    response = a2a(client_for(api_caller.raw_key), "SendMessage", {"message": message})
    assert response.status_code == 200 and not response.streaming
    assert response.json()["error"]["code"] == -32602
    assert not Run.objects.exists()


def test_a_failure_to_read_the_task_while_waiting_ends_the_body_as_a_json_rpc_error(
    api_caller: ApiCaller, quiet: Agent, fast_waits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 200 went with the first space: a failure after it is the body's JSON-RPC error naming the task, which
    goes on (it was a 500 after the wait)."""
    message = {"messageId": "m-broken", "role": "ROLE_USER", "parts": [{"text": "q"}]}
    response = a2a(client_for(api_caller.raw_key), "SendMessage", {"message": message})
    chunks = iter(response.streaming_content)
    assert next(chunks) == b" "

    def broken(run: Run, **kwargs: Any) -> Any:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(a2a_server, "task_of", broken)
    Run.objects.update(status=Run.Status.SUCCEEDED, finished_at=timezone.now())
    answer = json.loads(rest_of(chunks))
    run = Run.objects.get()
    assert answer["id"] == "r1" and answer["error"]["code"] == -32603
    assert answer["error"]["data"][0]["reason"] == "INTERNAL"
    assert answer["error"]["data"][0]["metadata"] == {"taskId": str(run.pk)}
    assert str(run.pk) in answer["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_answers_head_and_first_space_are_sent_while_the_run_is_still_queued(
    api_caller: ApiCaller, fast_waits: Any
) -> None:
    """The SDK client's httpx reads with a 5 s timeout: the response must begin before the run stops (here the
    run stops only once the client has seen the first space)."""
    from agent_platform.asgi import application

    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    message = {"messageId": "m-asgi", "role": "ROLE_USER", "parts": [{"text": "안녕하세요"}]}
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "SendMessage", "params": {"message": message}}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": A2A,
        "raw_path": A2A.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"a2a-version", b"1.0"),
            (b"authorization", f"Bearer {api_caller.raw_key}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    taken = False
    done = asyncio.Event()
    sent: list[dict[str, Any]] = []
    seen_while: list[str] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if not taken:
            taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    def status_then_finish() -> str:
        status = Run.objects.values_list("status", flat=True).get()
        Run.objects.update(status=Run.Status.SUCCEEDED, answer="반갑습니다.", finished_at=timezone.now())
        return status

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))
        if message["type"] == "http.response.body" and message.get("body", b"").strip() == b"" and not seen_while:
            seen_while.append(await sync_to_async(status_then_finish, thread_sensitive=False)())
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=30))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert seen_while == [Run.Status.QUEUED]
    answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.mark.django_db(transaction=True)
def test_the_a2a_sdk_client_reads_a_blocking_answer_that_starts_with_whitespace(
    api_caller: ApiCaller, settings: Any
) -> None:
    from agent_platform.asgi import application

    settings.PLATFORM_SSE_POLL_S = 0.02
    settings.PLATFORM_SSE_KEEPALIVE_S = 0.05
    settings.PLATFORM_API_MAX_WAIT_S = 0.3  # the run is never executed here: the answer is the task, submitted
    make_agent(slug="quiet", servers=[], with_demo_rules=False)

    async def scenario() -> Any:
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {api_caller.raw_key}"}
        async with httpx.AsyncClient(transport=transport, headers=headers, base_url="http://testserver") as http:
            config = ClientConfig(httpx_client=http, streaming=False)
            client = await create_client("http://testserver/a2a/quiet/", client_config=config)
            message = Message(role=Role.ROLE_USER, message_id="m-sdk", parts=[Part(text="김하늘 님은?")])
            return [event async for event in client.send_message(SendMessageRequest(message=message))]

    [event] = asyncio.run(scenario())
    assert event.task.id == str(Run.objects.get().pk)
    assert event.task.status.state == TaskState.TASK_STATE_SUBMITTED


# --- 2. a task's status time is its latest change --------------------------------------------------------------


def _at(minutes: int) -> datetime:
    return datetime(2020, 1, 1, 9, 0, tzinfo=UTC) + timedelta(minutes=minutes)


def _event(run: Run, seq: int, kind: str, data: dict[str, Any], at: datetime) -> None:
    event = RunEvent.objects.create(run=run, seq=seq, kind=kind, data=data)
    RunEvent.objects.filter(pk=event.pk).update(created_at=at)


def _parked_run(api_caller: ApiCaller, agent: Agent) -> Run:
    """Started at minute 0, a tool call at minute 5, parked for approval at minute 6."""
    run = Run.objects.create(
        agent=agent, api_key=api_caller.key, query="메모 저장", status=Run.Status.AWAITING_APPROVAL, started_at=_at(0)
    )
    _event(run, 1, "status", {"status": "running"}, _at(0))
    _event(run, 2, "tool_call", {"name": "search_employee", "ok": True}, _at(5))
    _event(run, 3, "status", {"status": "awaiting_approval"}, _at(6))
    return run


def test_an_input_required_task_is_stamped_when_it_began_to_wait_not_when_it_started(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    run = _parked_run(api_caller, quiet)
    client = client_for(api_caller.raw_key)
    status = a2a(client, "GetTask", {"id": str(run.pk)}).json()["result"]["status"]
    assert status["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert status["timestamp"] == "2020-01-01T09:06:00.000000Z"
    # A poller whose mark is after the run started but before it parked sees it.
    listed = a2a(client, "ListTasks", {"statusTimestampAfter": "2020-01-01T09:03:00Z"}).json()["result"]
    assert [t["id"] for t in listed["tasks"]] == [str(run.pk)]
    assert listed["tasks"][0]["status"]["timestamp"] == status["timestamp"]


def test_a_task_queued_again_after_an_approval_does_not_go_back_in_time(api_caller: ApiCaller, quiet: Agent) -> None:
    run = _parked_run(api_caller, quiet)
    client = client_for(api_caller.raw_key)
    parked_at = a2a(client, "GetTask", {"id": str(run.pk)}).json()["result"]["status"]["timestamp"]
    Run.objects.filter(pk=run.pk).update(status=Run.Status.QUEUED)  # as run_resume leaves it
    status = a2a(client, "GetTask", {"id": str(run.pk)}).json()["result"]["status"]
    assert status["state"] == "TASK_STATE_SUBMITTED"
    assert status["timestamp"] >= parked_at
    # Its worker claims it again: the task is working from then.
    _event(run, 4, "status", {"status": "running"}, _at(9))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    status = a2a(client, "GetTask", {"id": str(run.pk)}).json()["result"]["status"]
    assert (status["state"], status["timestamp"]) == ("TASK_STATE_WORKING", "2020-01-01T09:09:00.000000Z")
    listed = a2a(client, "ListTasks", {"statusTimestampAfter": "2020-01-01T09:08:00Z"}).json()["result"]
    assert listed["totalSize"] == 1


def test_a_finished_task_is_stamped_when_it_finished_and_a_run_without_events_as_before(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    done = Run.objects.create(
        agent=quiet,
        api_key=api_caller.key,
        query="q",
        status=Run.Status.SUCCEEDED,
        started_at=_at(0),
        finished_at=_at(2),
    )
    _event(done, 1, "status", {"status": "succeeded"}, _at(3))  # a late event does not move its end
    fresh = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q")
    client = client_for(api_caller.raw_key)
    assert a2a(client, "GetTask", {"id": str(done.pk)}).json()["result"]["status"]["timestamp"] == (
        "2020-01-01T09:02:00.000000Z"
    )
    listed = a2a(client, "ListTasks", {}).json()["result"]["tasks"]
    assert [t["id"] for t in listed] == [str(fresh.pk), str(done.pk)]  # the latest status change first
    assert listed[0]["status"]["timestamp"].startswith(fresh.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))


# --- 3. an MCP cancellation reaches the run from any process ---------------------------------------------------


def test_an_mcp_cancellation_reaching_a_process_that_never_saw_the_call_cancels_its_run(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    client = client_for(api_caller.raw_key)
    call = {"name": "ask_quiet", "arguments": {"query": "오래 걸리는 질문"}}
    mcp(client, "tools/call", call, rpc_id=7, **{"Mcp-Session-Id": "s-1"})
    mcp(client, "tools/call", call, rpc_id=7, **{"Mcp-Session-Id": "s-2"})
    mine, theirs = Run.objects.order_by("created_at")
    # Another web process: its own (local-memory) cache, without whatever this one kept of the call.
    cache.clear()
    cancelled = {"requestId": 7, "reason": "the user pressed stop"}
    assert mcp(client, "notifications/cancelled", cancelled, rpc_id=None, **{"Mcp-Session-Id": "s-1"}).status_code == (
        202
    )
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.status == Run.Status.CANCELLED
    assert theirs.status == Run.Status.QUEUED  # the same request id in another session is another call


def test_an_mcp_cancellation_does_not_reach_another_keys_run_or_a_call_long_past(
    api_caller: ApiCaller, quiet: Agent, settings: Any
) -> None:
    from agents.services import api_key_create

    client = client_for(api_caller.raw_key)
    call = {"name": "ask_quiet", "arguments": {"query": "q"}}
    mcp(client, "tools/call", call, rpc_id=1)
    old = Run.objects.get()
    Run.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.PLATFORM_SSE_MAX_S + 61)
    )
    other = client_for(api_key_create(actor="test", via="tests", name="other")[1])
    mcp(other, "tools/call", call, rpc_id=2)
    mcp(client, "notifications/cancelled", {"requestId": 1}, rpc_id=None)
    mcp(client, "notifications/cancelled", {"requestId": 2}, rpc_id=None)
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.QUEUED}


def test_a_request_id_used_again_makes_a_new_run_and_cancels_the_latest(api_caller: ApiCaller, quiet: Agent) -> None:
    """A client without a session may send id 1 every time: a new call, never the old run replayed."""
    client = client_for(api_caller.raw_key)
    call = {"name": "ask_quiet", "arguments": {"query": "q"}}
    mcp(client, "tools/call", call, rpc_id=1)
    first = Run.objects.get()
    Run.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(seconds=5))
    mcp(client, "tools/call", call, rpc_id=1)
    second = Run.objects.exclude(pk=first.pk).get()
    mcp(client, "notifications/cancelled", {"requestId": 1}, rpc_id=None)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == (Run.Status.QUEUED, Run.Status.CANCELLED)


# --- 4. what the servers say of themselves is in the caller's language ------------------------------------------


@pytest.fixture
def marked_gettext(monkeypatch: pytest.MonkeyPatch) -> None:
    """gettext that marks its text with the language active when it is called: a text built at import, or not
    passed through gettext, is unmarked; one built per request carries the caller's language."""

    def marked(message: str) -> str:
        return f"[{translation.get_language()}] {message}"

    monkeypatch.setattr(mcp_server, "_", marked)
    monkeypatch.setattr(a2a_server, "_", marked)


def test_the_mcp_instructions_tool_descriptions_and_input_schema_are_in_the_callers_language(
    api_caller: ApiCaller, quiet: Agent, marked_gettext: None
) -> None:
    client = client_for(api_caller.raw_key, HTTP_ACCEPT_LANGUAGE="ko")
    init = mcp(client, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}}).json()["result"]
    assert init["instructions"].startswith("[ko] Each tool asks one agent")
    [tool] = mcp(client, "tools/list").json()["result"]["tools"]
    assert tool["description"].startswith("[ko] Ask the agent 'quiet'.")
    for name, field in tool["inputSchema"]["properties"].items():
        assert field["description"].startswith("[ko] "), name
    english = client_for(api_caller.raw_key, HTTP_ACCEPT_LANGUAGE="en")
    [tool] = mcp(english, "tools/list").json()["result"]["tools"]
    assert tool["inputSchema"]["properties"]["query"]["description"].startswith("[en] ")


def test_the_a2a_directory_card_default_skill_and_security_scheme_are_in_the_callers_language(
    api_caller: ApiCaller, quiet: Agent, marked_gettext: None
) -> None:
    make_agent(slug="hush", servers=[], with_demo_rules=False)
    client = client_for(api_caller.raw_key, HTTP_ACCEPT_LANGUAGE="ko")
    directory = client.get("/.well-known/agent-card.json").json()
    assert directory["description"].startswith("[ko] The agents this API key may use")
    scheme = directory["securitySchemes"]["apiKey"]["httpAuthSecurityScheme"]
    assert scheme["description"].startswith("[ko] Authorization: Bearer")
    card = client.get("/a2a/quiet/.well-known/agent-card.json").json()
    assert card["skills"] == [
        {"id": "ask", "name": "quiet", "description": "[ko] Ask the agent 'quiet'.", "tags": ["ask"]}
    ]


# --- 5. approval ids in the text, every A2A state, no session to delete ----------------------------------------


def test_an_mcp_result_awaiting_approvals_names_each_approvals_id_in_its_text(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="메모", status=Run.Status.AWAITING_APPROVAL)
    approvals = [
        Approval.objects.create(
            run=run,
            mcp_id="demo",
            tool=tool,
            args={"text": "회의록"},
            call_hash=tool[0] * 64,
            expires_at=timezone.now() + timedelta(hours=1),
        )
        for tool in ("append_note", "send_mail")
    ]
    text = call_result(run)["content"][0]["text"]
    for approval in approvals:
        assert f"{approval.tool} " in text
        assert f"POST /api/v1/runs/{run.pk}/approvals/{approval.pk}" in text, text
    assert "<approval_id>" not in text
    assert '"회의록"' in text  # Korean as it is


@pytest.mark.parametrize("state", ["TASK_STATE_REJECTED", "TASK_STATE_AUTH_REQUIRED"])
def test_list_tasks_by_a_state_the_platform_never_reports_is_an_empty_list(
    api_caller: ApiCaller, quiet: Agent, state: str
) -> None:
    Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.FAILED)
    answer = a2a(client_for(api_caller.raw_key), "ListTasks", {"status": state}).json()
    assert answer["result"]["tasks"] == [] and answer["result"]["totalSize"] == 0


def test_list_tasks_by_an_unknown_state_is_invalid_params(api_caller: ApiCaller, quiet: Agent) -> None:
    answer = a2a(client_for(api_caller.raw_key), "ListTasks", {"status": "TASK_STATE_DONE"}).json()
    assert answer["error"]["code"] == -32602
    assert "TASK_STATE_REJECTED" in answer["error"]["message"]


def test_an_mcp_session_cannot_be_deleted(api_caller: ApiCaller) -> None:
    """The server keeps no session, so none can be ended: 405, as MCP allows (it was a 204, even without a key)."""
    for client in (Client(), client_for(api_caller.raw_key)):
        response = client.delete("/mcp/", headers={"Mcp-Session-Id": "s-1"})
        assert response.status_code == 405
        assert response["Allow"] == "POST"
        assert response.json()["error"]["code"] == "method_not_allowed"
