"""The A2A and MCP endpoints against what a reviewer confirmed live (round 38):

1. every A2A refusal but a 429 read as the caller's bad input (-32602): a 503 ``config:secret_unreadable`` with no
   retry hint, a 403 an approval the caller may not give;
2. a blank ``message.contextId`` was accepted ("   " shared one history among every blank-context message of a
   key, "" was replaced by a new id); ``ListTasks`` took "" as a filter;
3. over its key's rate limit the MCP endpoint answered an HTTP 429, which ends the official client's session;
4. a server error in the middle of an A2A stream cut it with no JSON-RPC error;
5. a call waiting for approval was said to have failed ("approval:pending") in A2A/MCP progress lines;
6. an A2A decision's unknown members were ignored;
7. MCP invalid requests: a null id was a 200 while others were 400s, and a body without ``jsonrpc`` lost its id;
8. MCP echoed a non-ASCII ``MCP-Protocol-Version`` as mojibake and reflected a client's ``Mcp-Session-Id``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from django.db import OperationalError
from django.test import Client

from agents import selectors
from agents.api import a2a_server
from agents.api.protocol_http import tool_progress_text
from agents.models import Agent, Approval, Run
from tests.agents.test_poisoned_runs import poison_agent
from tests.api.test_a2a_answers_and_parts import parked, pending
from tests.api.test_protocol_sdk_defects import rest_of
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

A2A = "/a2a/company-assistant/"


def a2a(caller: ApiCaller, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client.post(A2A, json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0"})


def send(caller: ApiCaller, message: dict[str, Any]) -> Any:
    return a2a(caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})


def mcp_post(caller: ApiCaller, body: Any, **headers: str) -> Any:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json", **headers}
    )


def reason_and_code(error: dict[str, Any]) -> tuple[int, str, str]:
    info = error["data"][0]
    return error["code"], info["reason"], info.get("metadata", {}).get("code", "")


# --- 1. refusals by their HTTP status ---------------------------------------------------------------------------


def test_an_unreadable_secret_is_an_internal_error_with_the_rest_apis_retry_after(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    poison_agent(demo_agent)
    response = send(api_caller, {"messageId": "m-503", "parts": [{"text": "김하늘 님은 어느 팀 소속인가요?"}]})
    error = response.json()["error"]
    assert reason_and_code(error) == (-32603, "INTERNAL", "config:secret_unreadable")
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert error["data"][1] == {
        "@type": a2a_server.RETRY_INFO,
        "retryDelay": f"{response['Retry-After']}s",
    }
    assert not Run.objects.exists()


def test_an_approval_the_caller_may_not_give_is_permission_denied(api_caller: ApiCaller, demo_agent: Agent) -> None:
    run = parked(demo_agent, api_caller)
    model_call = pending(run, "call_1", "모델이 쓴 메모")
    answer = send(api_caller, {"messageId": "m-403", "taskId": str(run.pk), "parts": [{"text": "approve"}]})
    assert answer.status_code == 200
    assert reason_and_code(answer.json()["error"]) == (-32031, "PERMISSION_DENIED", "approval_needs_reviewer")
    model_call.refresh_from_db()
    assert model_call.status == Approval.Status.PENDING


def test_an_invalid_input_is_still_invalid_params(api_caller: ApiCaller, demo_agent: Agent) -> None:
    first = {"messageId": "m-same", "parts": [{"text": "김하늘 님은?"}]}
    assert "error" not in send(api_caller, first).json()
    other = send(api_caller, {**first, "parts": [{"text": "박서준 님은?"}]}).json()
    assert reason_and_code(other["error"]) == (-32602, "INVALID_PARAMS", "idempotency_key_reused")


# --- 2. a blank contextId -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_a_blank_message_context_id_is_refused(api_caller: ApiCaller, demo_agent: Agent, blank: str) -> None:
    message = {"messageId": str(uuid.uuid4()), "contextId": blank, "parts": [{"text": "안녕"}]}
    error = send(api_caller, message).json()["error"]
    assert reason_and_code(error)[:2] == (-32602, "INVALID_PARAMS")
    assert "message.contextId" in error["message"]
    assert not Run.objects.exists()


def test_a_blank_context_id_on_an_answer_is_refused_too(api_caller: ApiCaller, demo_agent: Agent) -> None:
    run = parked(demo_agent, api_caller)
    call = pending(run, "rule:1", "회의록")
    message = {"messageId": "m-a", "taskId": str(run.pk), "contextId": "", "parts": [{"text": "approve"}]}
    assert send(api_caller, message).json()["error"]["code"] == -32602
    call.refresh_from_db()
    assert call.status == Approval.Status.PENDING


@pytest.mark.parametrize("blank", ["", "  "])
def test_list_tasks_by_a_blank_context_id_is_refused(api_caller: ApiCaller, demo_agent: Agent, blank: str) -> None:
    error = a2a(api_caller, "ListTasks", {"contextId": blank}).json()["error"]
    assert error["code"] == -32602 and "contextId" in error["message"]


# --- 4. a server error mid-stream -------------------------------------------------------------------------------


def test_a_database_error_mid_stream_ends_it_with_an_internal_error_naming_the_task(
    api_caller: ApiCaller, demo_agent: Agent, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.PLATFORM_SSE_POLL_S = 0.0
    real = selectors.run_events_after
    calls = {"n": 0}

    def flaky(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OperationalError("database is locked")
        return real(**kwargs)

    monkeypatch.setattr(a2a_server, "run_events_after", flaky)
    message = {"messageId": "m-stream", "parts": [{"text": "김하늘 님은 어느 팀 소속인가요?"}]}
    response = a2a(api_caller, "SendStreamingMessage", {"message": message})
    assert response.status_code == 200
    events = [
        json.loads(line.removeprefix("data: "))
        for line in rest_of(iter(response.streaming_content)).decode().split("\n\n")
        if line.startswith("data: ")
    ]
    run = Run.objects.get()
    assert "task" in events[0]["result"]
    last = events[-1]
    assert last["id"] == "r1" and last["error"]["code"] == -32603
    assert last["error"]["data"][0]["metadata"] == {"taskId": str(run.pk)}
    assert str(run.pk) in last["error"]["message"]
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED  # the task goes on


# --- 5. progress wording ----------------------------------------------------------------------------------------


def test_a_call_waiting_for_approval_or_skipped_is_not_said_to_have_failed(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="메모 저장")
    waiting = tool_progress_text(run, {"tool": "append_note", "ok": False, "error": "approval:pending"})
    skipped = tool_progress_text(run, {"tool": "append_note", "ok": False, "reason": "rule:skipped"})
    failed = tool_progress_text(run, {"tool": "append_note", "ok": False, "error": "mcp:timeout"})
    assert "approval:pending" not in waiting and "append_note" in waiting
    assert "rule:skipped" not in skipped and "append_note" in skipped
    assert len({waiting, skipped, failed}) == 3 and "mcp:timeout" in failed


# --- 6. a decision's unknown members ----------------------------------------------------------------------------


def test_a_decision_with_an_unknown_member_is_refused_naming_it(api_caller: ApiCaller, demo_agent: Agent) -> None:
    run = parked(demo_agent, api_caller)
    call = pending(run, "rule:1", "회의록")
    data = {"decision": "approve", "approval_id": str(call.pk)}
    message = {"messageId": "m-d", "taskId": str(run.pk), "parts": [{"data": data}]}
    error = send(api_caller, message).json()["error"]
    assert error["code"] == -32602 and "approval_id" in error["message"]
    call.refresh_from_db()
    assert call.status == Approval.Status.PENDING


# --- 3. MCP over the rate limit ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_mcp_client_over_the_rate_limit_is_told_to_wait_and_its_session_goes_on(
    api_caller: ApiCaller, settings: Any
) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import McpError

    from agent_platform.asgi import application

    settings.PLATFORM_API_RATE = "4/min"  # initialize, notifications/initialized and two lists

    async def scenario() -> tuple[Any, Any]:
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {api_caller.raw_key}"}
        async with (
            httpx.AsyncClient(transport=transport, headers=headers, base_url="http://testserver") as http,
            streamable_http_client("http://testserver/mcp/", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.list_tools()
            await session.list_tools()
            with pytest.raises(McpError) as refused:
                await asyncio.wait_for(session.list_tools(), 10)
            call = await asyncio.wait_for(session.call_tool("ask_company-assistant", {"query": "q"}), 10)
            return refused.value.error, call

    error, call = asyncio.run(scenario())
    assert error.code == -32029 and "seconds" in error.message
    assert call.isError and call.content[0].text.startswith("throttled: ")
    assert not Run.objects.exists()


def test_an_mcp_request_over_the_rate_limit_is_a_200_and_a_notification_over_it_a_dropped_202(
    api_caller: ApiCaller, settings: Any
) -> None:
    settings.PLATFORM_API_RATE = "2/min"
    # A notification counts (a stream of them was a way around the limit), answered its usual 202.
    assert mcp_post(api_caller, {"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    assert mcp_post(api_caller, {"jsonrpc": "2.0", "id": 1, "method": "ping"}).json()["result"] == {}
    refused = mcp_post(api_caller, {"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert refused.status_code == 200 and int(refused["Retry-After"]) > 0
    assert refused.json()["id"] == 2 and refused.json()["error"]["code"] == -32029
    # Over the limit, a notification is dropped with its 202 (a 429 would end the client's session).
    assert mcp_post(api_caller, {"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202


# --- 7. and 8. MCP invalid requests and echoed headers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "echoed"),
    [
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, None),
        ({"jsonrpc": "2.0", "id": True, "method": "ping"}, None),
        ({"id": 5, "method": "ping"}, 5),
        ({"jsonrpc": "1.0", "id": "x", "method": "ping"}, "x"),
        ({"jsonrpc": "2.0", "id": 6, "method": 7}, 6),
    ],
)
def test_every_invalid_mcp_request_is_a_400_echoing_a_valid_id(
    api_caller: ApiCaller, body: dict[str, Any], echoed: Any
) -> None:
    response = mcp_post(api_caller, body)
    assert response.status_code == 400
    assert response.json()["id"] == echoed and response.json()["error"]["code"] == -32600


def test_a_non_ascii_protocol_version_is_not_echoed_as_mojibake(api_caller: ApiCaller) -> None:
    response = mcp_post(api_caller, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, **{"MCP-Protocol-Version": "김"})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.isascii() and "Version ?;" in message


def test_initialize_issues_the_servers_own_session_id(api_caller: ApiCaller) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
    response = mcp_post(api_caller, body, **{"Mcp-Session-Id": "chosen-by-the-client"})
    assert response.status_code == 200
    assert response["Mcp-Session-Id"] not in ("", "chosen-by-the-client")
