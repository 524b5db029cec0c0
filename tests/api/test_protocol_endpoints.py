"""The A2A and MCP endpoints' contract in the fast loop (Django's test client; runs are queued, not executed):
cards and what a scoped key sees, JSON-RPC errors mapped from ours, a message's parts mapped onto the run, and
the MCP handshake. ``tests/e2e/test_protocols.py`` drives both with the official clients against a live platform."""

from __future__ import annotations

import base64
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from agents.budgets import budget_create
from agents.models import Agent, Approval, Run
from agents.services import api_key_create
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def scoped(demo_agent: Agent, demo_server: Any) -> ApiCaller:
    other = make_agent(slug="other", servers=[demo_server], with_demo_rules=False)
    return ApiCaller(*api_key_create(actor="test", via="tests", name="scoped", agents=[other]))


def client_for(raw_key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")


def rpc(client: Client, slug: str, method: str, params: dict[str, Any] | None = None, **headers: str) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params or {}}
    response = client.post(f"/a2a/{slug}/", json.dumps(body), content_type="application/json", headers=headers)
    assert response.status_code == 200, response.content
    return response.json()


def error_code(answer: dict[str, Any]) -> tuple[int, str]:
    error = answer["error"]
    return error["code"], error["data"][0].get("metadata", {}).get("code", "")


def test_an_agent_card_names_its_endpoint_streaming_and_bearer_auth(api_caller: ApiCaller, demo_agent: Agent) -> None:
    card = client_for(api_caller.raw_key).get("/a2a/company-assistant/.well-known/agent-card.json").json()
    assert card["supportedInterfaces"] == [
        {"url": "http://testserver/a2a/company-assistant/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    ]
    assert card["capabilities"]["streaming"] is True
    assert card["securitySchemes"]["apiKey"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    names = {skill["name"] for skill in card["skills"]}
    assert "search_employee" in names  # a tool
    for skill in card["skills"]:  # a tool's docstring without its source indentation
        assert "\n    " not in skill["description"], skill
    assert any(skill["id"].startswith("rule-") for skill in card["skills"])  # a rule


def test_a_scoped_key_sees_only_its_agents(scoped: ApiCaller, api_caller: ApiCaller) -> None:
    client = client_for(scoped.raw_key)
    directory = client.get("/.well-known/agent-card.json").json()
    assert [a["slug"] for a in directory["agents"]] == ["other"]
    assert client.get("/a2a/company-assistant/.well-known/agent-card.json").status_code == 404
    response = client.post("/a2a/company-assistant/", "{}", content_type="application/json")
    assert (response.status_code, response.json()["error"]["code"]) == (404, "agent_not_found")
    everyone = client_for(api_caller.raw_key).get("/.well-known/agent-card.json").json()
    assert [a["slug"] for a in everyone["agents"]] == ["company-assistant", "other"]
    # A skill says what the agent does (its system prompt's first line, else its name), not where it is.
    for skill in everyone["skills"]:
        assert not skill["description"].startswith("http"), skill
    # A card needs an interface (A2A's discovery at the domain's card failed: "no compatible transports"): the
    # directory lists the agents' endpoints; a key with one agent gets that agent's card.
    assert [i["url"] for i in everyone["supportedInterfaces"]] == [
        "http://testserver/a2a/company-assistant/",
        "http://testserver/a2a/other/",
    ]
    assert directory["name"] == "other" and directory["supportedInterfaces"][0]["url"] == "http://testserver/a2a/other/"


def test_without_a_key_the_cards_and_endpoints_are_refused(demo_agent: Agent) -> None:
    client = Client()
    for path in ("/.well-known/agent-card.json", "/a2a/company-assistant/.well-known/agent-card.json"):
        assert client.get(path).status_code == 401
    for path in ("/a2a/company-assistant/", "/mcp/"):
        response = client.post(path, "{}", content_type="application/json")
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_message_maps_its_parts_onto_the_run(api_caller: ApiCaller, demo_agent: Agent) -> None:
    message = {
        "messageId": "m-1",
        "contextId": "conv-9",
        "role": "ROLE_USER",
        "parts": [
            {"text": "주문 상태를 알려주세요"},
            {"data": {"order": {"id": "O-1001"}}},
            {"url": "https://example.com/r.pdf", "filename": "r.pdf", "mediaType": "application/pdf"},
            {"raw": base64.b64encode(b"12345").decode(), "filename": "a.txt"},
        ],
    }
    params = {
        "message": message,
        "configuration": {"returnImmediately": True},
        "metadata": {"context": {"userId": "E-1"}},
    }
    answer = rpc(client_for(api_caller.raw_key), "company-assistant", "SendMessage", params)
    task = answer["result"]["task"]
    assert (task["contextId"], task["status"]["state"]) == ("conv-9", "TASK_STATE_SUBMITTED")
    run = Run.objects.get(pk=task["id"])
    assert run.query == "주문 상태를 알려주세요"
    assert run.a2a_data == [{"order": {"id": "O-1001"}}]
    assert run.a2a_files == [
        {"name": "r.pdf", "mimeType": "application/pdf", "uri": "https://example.com/r.pdf"},
        {"name": "a.txt", "size": 5},
    ]
    assert run.context == {"userId": "E-1", "contextId": "conv-9"}
    # The same messageId again is the same task.
    again = rpc(client_for(api_caller.raw_key), "company-assistant", "SendMessage", params)
    assert again["result"]["task"]["id"] == task["id"]
    assert Run.objects.count() == 1


def test_our_errors_become_a2a_errors(api_caller: ApiCaller, demo_agent: Agent) -> None:
    client = client_for(api_caller.raw_key)
    assert error_code(rpc(client, "company-assistant", "GetTask", {"id": "nope"})) == (-32001, "run_not_found")
    assert rpc(client, "company-assistant", "Frobnicate")["error"]["code"] == -32601
    bad_part = {"message": {"messageId": "x", "role": "ROLE_USER", "parts": [{"url": "not a uri"}]}}
    assert error_code(rpc(client, "company-assistant", "SendMessage", bad_part)) == (-32602, "invalid_input")
    assert error_code(rpc(client, "company-assistant", "SendMessage", {})) == (-32602, "invalid_input")
    assert rpc(client, "company-assistant", "CreateTaskPushNotificationConfig")["error"]["code"] == -32003
    old = rpc(client, "company-assistant", "GetTask", {"id": "x"}, **{"A2A-Version": "0.3"})
    assert old["error"]["code"] == -32009
    parse = client.post("/a2a/company-assistant/", "{not json", content_type="application/json")
    assert parse.json()["error"]["code"] == -32700


def test_a_spent_budget_is_an_http_429_with_retry_after_on_both_send_methods(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    from django.utils import timezone

    from agents.budgets import period_bounds
    from agents.models import BudgetUsage

    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 100, "run_reservation_tokens": 100},
    )
    # One token of it used today: a run's reservation of 100 no longer fits.
    BudgetUsage.objects.create(budget=budget, period_start=period_bounds("day", timezone.now())[0], used_tokens=1)
    client = client_for(api_caller.raw_key)
    for method in ("SendMessage", "SendStreamingMessage"):
        message = {"messageId": f"m-{method}", "role": "ROLE_USER", "parts": [{"text": "안녕"}]}
        body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": {"message": message}}
        response = client.post("/a2a/company-assistant/", json.dumps(body), content_type="application/json")
        assert response.status_code == 429, response.content
        retry_after = int(response["Retry-After"])
        assert 0 < retry_after <= 86400
        error = response.json()["error"]
        assert error_code(response.json()) == (-32029, "budget_exceeded")
        info, retry = error["data"]
        assert info["reason"] == "RESOURCE_EXHAUSTED" and info["metadata"]["resets_at"]
        assert retry == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after}s"}
    assert not Run.objects.exists()


def test_an_input_required_task_asks_for_the_approval_in_the_callers_language(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run = Run.objects.create(
        agent=demo_agent, api_key=api_caller.key, query="메모 저장", status=Run.Status.AWAITING_APPROVAL
    )
    Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="a" * 64,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    client = client_for(api_caller.raw_key)
    for language, asks in (("en", "Approval needed before these calls: append_note"), ("ko", "승인이 필요합니다")):
        task = rpc(client, "company-assistant", "GetTask", {"id": str(run.pk)}, **{"Accept-Language": language})
        status = task["result"]["status"]
        assert status["state"] == "TASK_STATE_INPUT_REQUIRED"
        text = status["message"]["parts"][0]["text"]
        assert asks in text and '"decision"' in text and "회의록" in text


def test_a_finished_task_cannot_be_cancelled_but_a_queued_one_can(api_caller: ApiCaller, demo_agent: Agent) -> None:
    client = client_for(api_caller.raw_key)
    message = {"messageId": "m-2", "role": "ROLE_USER", "parts": [{"text": "안녕"}]}
    task = rpc(
        client, "company-assistant", "SendMessage", {"message": message, "configuration": {"returnImmediately": True}}
    )
    task_id = task["result"]["task"]["id"]
    cancelled = rpc(client, "company-assistant", "CancelTask", {"id": task_id})["result"]
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    assert error_code(rpc(client, "company-assistant", "CancelTask", {"id": task_id})) == (-32002, "run_finished")
    assert error_code(rpc(client, "company-assistant", "SubscribeToTask", {"id": task_id}))[0] == -32004


def mcp(client: Client, method: str, params: dict[str, Any] | None = None, *, rpc_id: Any = 1) -> Any:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if rpc_id is not None:
        body["id"] = rpc_id
    return client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": "application/json"}
    )


def test_mcp_initialize_and_tools_per_key(scoped: ApiCaller, api_caller: ApiCaller) -> None:
    client = client_for(scoped.raw_key)
    init = mcp(client, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert init.json()["result"]["protocolVersion"] == "2025-06-18"
    assert init.json()["result"]["capabilities"] == {"tools": {"listChanged": False}}
    assert init["Mcp-Session-Id"]
    assert mcp(client, "notifications/initialized", rpc_id=None).status_code == 202
    tools = mcp(client, "tools/list").json()["result"]["tools"]
    assert [t["name"] for t in tools] == ["ask_other"]
    assert tools[0]["inputSchema"]["required"] == ["query"]
    everyone = mcp(client_for(api_caller.raw_key), "tools/list").json()["result"]["tools"]
    assert [t["name"] for t in everyone] == ["ask_company-assistant", "ask_other"]
    assert client.get("/mcp/").status_code == 405


def test_an_mcp_call_to_a_tool_the_key_may_not_use_or_with_bad_arguments_is_refused(scoped: ApiCaller) -> None:
    client = client_for(scoped.raw_key)
    unknown = mcp(client, "tools/call", {"name": "ask_company-assistant", "arguments": {"query": "x"}}).json()
    assert unknown["error"]["code"] == -32602
    bad = mcp(client, "tools/call", {"name": "ask_other", "arguments": {"query": "x", "extra": 1}}).json()
    assert bad["result"]["isError"] is True
    assert "invalid_input" in bad["result"]["content"][0]["text"]
    assert Run.objects.count() == 0


def test_an_mcp_call_from_a_json_only_client_is_answered_with_one_json_body(api_caller: ApiCaller, settings) -> None:
    """The answer starts at once and keeps the connection alive with JSON's own whitespace until the run is done
    (here: until the call's time is up, as the run is never executed in this test), then the result."""
    settings.PLATFORM_SSE_POLL_S = 0.02
    settings.PLATFORM_SSE_KEEPALIVE_S = 0.05
    settings.PLATFORM_SSE_MAX_S = 0.3
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    response = mcp(client_for(api_caller.raw_key), "tools/call", {"name": "ask_quiet", "arguments": {"query": "q"}})
    assert response.status_code == 200 and response["Content-Type"] == "application/json; charset=utf-8"
    body = b"".join(response.streaming_content).decode()
    assert body.startswith(" ") and body.strip().startswith("{")  # kept alive while it waited
    answer = json.loads(body)
    assert (answer["jsonrpc"], answer["id"]) == ("2.0", 1)
    assert answer["result"]["structuredContent"]["status"] == "queued"
    assert Run.objects.get().status == Run.Status.QUEUED


def test_a_stream_refused_for_want_of_a_slot_submitted_nothing_and_an_error_frees_its_slot(
    api_caller: ApiCaller, demo_agent: Agent, settings
) -> None:
    """A client told 429 + Retry-After sends its message again: the refusal must come before the run is created
    (or an approval decided), or the message would be carried out twice. A streaming call refused for another
    reason gives its slot back."""
    from agents.api.throttling import stream_slot_acquire, stream_slot_release

    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    held = stream_slot_acquire(api_caller.key, lease_s=60)
    assert held is not None
    client = client_for(api_caller.raw_key)
    message = {"messageId": "m-slot", "role": "ROLE_USER", "parts": [{"text": "메모 남겨줘"}]}
    body = {"jsonrpc": "2.0", "id": "r1", "method": "SendStreamingMessage", "params": {"message": message}}
    refused = client.post("/a2a/company-assistant/", json.dumps(body), content_type="application/json")
    assert refused.status_code == 429 and refused.json()["error"]["data"][0]["metadata"]["code"] == "too_many_streams"
    assert not Run.objects.exists()
    stream_slot_release(held)
    # A streaming call that fails (no such task) answers its error and leaves the slot free for the next one.
    lost = rpc(client, "company-assistant", "SubscribeToTask", {"id": "00000000-0000-0000-0000-000000000000"})
    assert lost["error"]["code"] == -32001
    again = stream_slot_acquire(api_caller.key, lease_s=60)
    assert again is not None
    stream_slot_release(again)


def mcp_post_scope(body: bytes, *, raw_key: str, accept: str) -> dict[str, Any]:
    """An ASGI scope of a POST /mcp/ (for tests that drive the ASGI application and its client's disconnect)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp/",
        "raw_path": b"/mcp/",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"accept", accept.encode()),
            (b"authorization", f"Bearer {raw_key}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


@pytest.mark.django_db(transaction=True)
def test_an_mcp_call_whose_json_only_client_goes_away_is_cancelled(api_caller: ApiCaller, settings) -> None:
    """A client that takes no event stream waits for the JSON answer; when it disconnects (Django's ASGI handler
    cancels the view), its run is cancelled as a stream client's is, not left to run for nobody."""
    import asyncio

    from agent_platform.asgi import application

    settings.PLATFORM_SSE_POLL_S = 0.05
    settings.PLATFORM_SSE_MAX_S = 20  # bounds the wait where the disconnect is missed
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "q"}},
    }
    body = json.dumps(call).encode()
    scope = mcp_post_scope(body, raw_key=api_caller.raw_key, accept="application/json")
    taken = False
    started = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if not taken:
            taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        await started.wait()  # the answer has begun (its run is made): now the client goes away
        await asyncio.sleep(0.3)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.start":
            started.set()

    asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=30))
    [run] = Run.objects.all()
    assert run.status == Run.Status.CANCELLED
    assert sent[0]["status"] == 200 and (b"Content-Type", b"application/json; charset=utf-8") in sent[0]["headers"]


@pytest.mark.django_db(transaction=True)
def test_an_mcp_call_whose_client_goes_away_while_its_run_is_made_is_cancelled(
    api_caller: ApiCaller, settings, monkeypatch
) -> None:
    """The client leaves while the call is still submitting its run: Django cancels the view, not the thread that
    makes the run, so the run is made all the same; it must then be cancelled, not left to run for nobody."""
    import asyncio
    import threading

    from agent_platform.asgi import application
    from agents.api import mcp_server

    settings.PLATFORM_SSE_POLL_S = 0.05
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    gone = threading.Event()
    real_create = mcp_server.run_create

    def create_then_find_the_client_gone(**kwargs: Any) -> Any:
        run = real_create(**kwargs)
        assert gone.wait(10)  # the run is made; the client leaves before the call has returned it
        time.sleep(0.2)  # and Django has cancelled the view meanwhile
        return run

    monkeypatch.setattr(mcp_server, "run_create", create_then_find_the_client_gone)
    call = {
        "jsonrpc": "2.0",
        "id": 4,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "q"}},
    }
    body = json.dumps(call).encode()
    scope = mcp_post_scope(body, raw_key=api_caller.raw_key, accept="application/json, text/event-stream")
    taken = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if not taken:
            taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        while not await sync_to_async(Run.objects.exists, thread_sensitive=False)():
            await asyncio.sleep(0.01)
        gone.set()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=30))
    [run] = Run.objects.all()
    assert run.status == Run.Status.CANCELLED
    assert sent == []  # nothing was answered: the client had gone
    # Its stream slot (the key's only one) was given back.
    from agents.api.throttling import stream_slot_acquire, stream_slot_release

    slot = stream_slot_acquire(api_caller.key, lease_s=60)
    assert slot is not None
    stream_slot_release(slot)


def test_a_server_error_while_a_json_only_call_waits_ends_the_body_as_json_and_leaves_the_run(settings) -> None:
    """A failure to read the run (the database hiccups) is the server's, not the client's leaving: the body ends
    as a JSON-RPC error (it was a 200 already) and the run is not cancelled."""
    from agents.api.mcp_server import _answered_whatever_happens
    from agents.api.protocol_http import json_body, paced_sync

    settings.PLATFORM_SSE_POLL_S = 0.0
    polls = iter([([": keep-alive\n\n"], "wait")])

    def poll() -> Any:
        try:
            return next(polls)
        except StopIteration:
            raise RuntimeError("database is locked") from None

    abandoned: list[bool] = []
    guarded = _answered_whatever_happens(poll, 7, "run-1")
    body = "".join(paced_sync(json_body(guarded), None, on_abandon=lambda: abandoned.append(True)))
    assert body.startswith(" ")
    answer = json.loads(body)
    assert (answer["id"], answer["error"]["code"], answer["error"]["data"]) == (7, -32603, {"run_id": "run-1"})
    assert "/api/v1/runs/run-1" in answer["error"]["message"]
    assert abandoned == []
    # On an event stream the same failure is the request's last message, not a stream cut short.
    polls = iter([([": keep-alive\n\n"], "wait")])
    chunks = list(
        paced_sync(_answered_whatever_happens(poll, 7, "run-1"), None, on_abandon=lambda: abandoned.append(True))
    )
    assert chunks[0] == ": keep-alive\n\n" and chunks[-1].startswith("event: message\ndata: ")
    assert json.loads(chunks[-1].split("data: ", 1)[1])["error"]["data"] == {"run_id": "run-1"}
    assert abandoned == []


def test_a_client_that_leaves_a_stream_abandons_its_call_but_a_server_error_does_not(settings) -> None:
    from agents.api.protocol_http import paced_sync

    settings.PLATFORM_SSE_POLL_S = 0.0
    abandoned: list[str] = []
    stream = paced_sync(lambda: ([": keep-alive\n\n"], "wait"), None, on_abandon=lambda: abandoned.append("left"))
    next(stream)
    stream.close()  # the server closes the response: the client went away
    assert abandoned == ["left"]

    def broken() -> Any:
        raise RuntimeError("database is locked")

    with pytest.raises(RuntimeError):
        list(paced_sync(broken, None, on_abandon=lambda: abandoned.append("error")))
    assert abandoned == ["left"]


def test_an_mcp_stream_refused_for_want_of_a_slot_started_no_run(api_caller: ApiCaller, settings) -> None:
    from agents.api.throttling import stream_slot_acquire, stream_slot_release

    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    held = stream_slot_acquire(api_caller.key, lease_s=60)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "q"}},
    }
    refused = client_for(api_caller.raw_key).post(
        "/mcp/",
        json.dumps(body),
        content_type="application/json",
        headers={"Accept": "application/json, text/event-stream"},
    )
    # The call's failure in its result, not an HTTP 429, which ended an MCP client's whole session.
    assert refused.status_code == 200
    result = refused.json()["result"]
    assert result["isError"] and result["content"][0]["text"].startswith("too_many_streams: ")
    assert not Run.objects.exists()
    stream_slot_release(held)


def test_an_mcp_protocol_version_the_server_does_not_speak_is_a_400(api_caller: ApiCaller) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    client = client_for(api_caller.raw_key)
    refused = client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"MCP-Protocol-Version": "1999-01-01"}
    )
    assert refused.status_code == 400 and "1999-01-01" in refused.json()["error"]["message"]
    spoken = client.post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"MCP-Protocol-Version": "2025-06-18"}
    )
    assert spoken.status_code == 200


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"decision": "approve", "reason": {"a": 1}}, "reason"),
        ({"decision": "approve", "reason": "이유" * 1001}, "reason"),
        ({"decision": ["approve"]}, "decision"),
        ({"decision": "approve", "approvalId": {"x": 1}}, "approvalId"),
    ],
)
def test_an_approval_reply_whose_fields_are_not_short_text_is_refused_and_decides_nothing(
    api_caller: ApiCaller, demo_agent: Agent, data: dict[str, Any], key: str
) -> None:
    """As the REST API reads a decision: an object reason was stored as Python's text of it ("{'a': 1}"), and the
    audit event kept a reason of any length."""
    run = Run.objects.create(
        agent=demo_agent, api_key=api_caller.key, query="메모 저장", status=Run.Status.AWAITING_APPROVAL
    )
    approval = Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="a" * 64,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    message = {"messageId": f"m-{key}", "role": "ROLE_USER", "taskId": str(run.pk), "parts": [{"data": data}]}
    answer = rpc(client_for(api_caller.raw_key), "company-assistant", "SendMessage", {"message": message})
    assert answer["error"]["code"] == -32602
    assert f"'{key}' must be text" in answer["error"]["message"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_an_a2a_call_without_the_trailing_slash_is_answered_not_redirected(api_caller: ApiCaller, demo_agent) -> None:
    body = {"jsonrpc": "2.0", "id": "r1", "method": "GetTask", "params": {"id": "00000000-0000-0000-0000-000000000000"}}
    response = client_for(api_caller.raw_key).post(
        "/a2a/company-assistant", json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 200 and response.json()["error"]["code"] == -32001


@pytest.mark.parametrize("token", [{"a": 1}, [1], True, 1.5, "t" * 201])
def test_a_progress_token_mcp_does_not_allow_is_refused_before_any_run(api_caller: ApiCaller, token: Any) -> None:
    """MCP: a string or an integer. Any other was echoed in every progress notification (a 100 kB token made a
    300 kB answer)."""
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    params = {"name": "ask_quiet", "arguments": {"query": "q"}, "_meta": {"progressToken": token}}
    answer = mcp(client_for(api_caller.raw_key), "tools/call", params).json()
    assert answer["error"]["code"] == -32602 and "progressToken" in answer["error"]["message"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("length", [-1, "3", 1.5, [1], True])
def test_a_history_length_that_is_no_count_is_refused(api_caller: ApiCaller, demo_agent: Agent, length: Any) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", status=Run.Status.SUCCEEDED)
    answer = rpc(
        client_for(api_caller.raw_key), "company-assistant", "GetTask", {"id": str(run.pk), "historyLength": length}
    )
    assert answer["error"]["code"] == -32602 and "historyLength" in answer["error"]["message"]
    shown = rpc(client_for(api_caller.raw_key), "company-assistant", "GetTask", {"id": str(run.pk), "historyLength": 0})
    assert "history" not in shown["result"]


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/json; charset=euc-kr", "application/x-www-form-urlencoded"]
)
def test_an_mcp_message_not_sent_as_json_in_utf8_is_a_415(api_caller: ApiCaller, content_type: str) -> None:
    """As the MCP SDK's own server answers; a body in EUC-KR was read as UTF-8."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    response = client_for(api_caller.raw_key).post("/mcp/", body, content_type=content_type)
    assert response.status_code == 415 and response.json()["error"]["code"] == -32600
    ok = client_for(api_caller.raw_key).post("/mcp/", body, content_type="application/json; charset=utf-8")
    assert ok.status_code == 200 and ok.json()["result"] == {}


@pytest.mark.parametrize("return_immediately", [True, False])
def test_a_message_with_a_history_length_that_is_no_count_creates_no_run(
    api_caller: ApiCaller, demo_agent: Agent, return_immediately: bool
) -> None:
    """It was checked after the run was queued: refused with the run made (a client correcting it made a second),
    or a 500 after the wait."""
    message = {"messageId": f"m-h-{return_immediately}", "role": "ROLE_USER", "parts": [{"text": "김하늘 님은?"}]}
    configuration = {"historyLength": -1, "returnImmediately": return_immediately}
    answer = rpc(
        client_for(api_caller.raw_key),
        "company-assistant",
        "SendMessage",
        {"message": message, "configuration": configuration},
    )
    assert answer["error"]["code"] == -32602 and "historyLength" in answer["error"]["message"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("part", [{"text": "q", "data": {"a": 1}}, {"url": "https://x.example/a.pdf", "raw": "AAAA"}])
def test_a_part_with_two_contents_is_refused_not_one_dropped(
    api_caller: ApiCaller, demo_agent: Agent, part: dict
) -> None:
    """A2A 1.0: a part's content is one of text, data, url or raw. With two, one was dropped without a word."""
    message = {"messageId": f"m-two-{len(part)}-{sorted(part)[0]}", "role": "ROLE_USER", "parts": [part]}
    answer = rpc(client_for(api_caller.raw_key), "company-assistant", "SendMessage", {"message": message})
    assert answer["error"]["code"] == -32602 and "not several" in answer["error"]["message"]
    rest = client_for(api_caller.raw_key).post(
        "/api/v1/runs",
        json.dumps({"agent": "company-assistant", "message": {"parts": [{"text": "김하늘?"}, part]}}),
        content_type="application/json",
    )
    assert rest.status_code == 400 and "not several" in rest.content.decode()
    assert not Run.objects.exists()


def test_an_mcp_query_longer_than_the_limit_is_the_tools_error_and_creates_no_run(
    api_caller: ApiCaller, settings
) -> None:
    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 10
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    params = {"name": "ask_quiet", "arguments": {"query": "김하늘 님은 어느 팀 소속인가요?"}}
    result = mcp(client_for(api_caller.raw_key), "tools/call", params).json()["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"] == "query_too_long: The query is longer than 10 characters."
    assert not Run.objects.exists()


def test_an_answer_naming_another_context_than_its_tasks_is_refused_and_decides_nothing(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    """A2A §3.4.3: a message that names a task must name the task's own context (it was applied whatever it said)."""
    run = Run.objects.create(
        agent=demo_agent,
        api_key=api_caller.key,
        query="메모 저장",
        status=Run.Status.AWAITING_APPROVAL,
        context={"contextId": "ctx-1"},
    )
    approval = Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="a" * 64,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    message = {
        "messageId": "m-ctx",
        "role": "ROLE_USER",
        "taskId": str(run.pk),
        "contextId": "other-ctx",
        "parts": [{"data": {"decision": "reject"}}],
    }
    answer = rpc(client_for(api_caller.raw_key), "company-assistant", "SendMessage", {"message": message})
    assert error_code(answer) == (-32602, "context_mismatch")
    assert "ctx-1" in answer["error"]["message"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_a_data_part_may_hold_any_json_value(api_caller: ApiCaller, demo_agent: Agent) -> None:
    """A2A 1.0's ``Part.data`` is any JSON value (a list, a text); rules and tools read it as ``{"value": ...}``."""
    message = {"messageId": "m-list", "role": "ROLE_USER", "parts": [{"text": "주문 목록"}, {"data": [1, "둘"]}]}
    answer = rpc(
        client_for(api_caller.raw_key),
        "company-assistant",
        "SendMessage",
        {"message": message, "configuration": {"returnImmediately": True}},
    )
    run = Run.objects.get(pk=answer["result"]["task"]["id"])
    assert run.a2a_data == [{"value": [1, "둘"]}]


def test_a_notification_starts_nothing_and_a_03_method_without_a_version_is_told_the_version(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    client = client_for(api_caller.raw_key)
    notification = {
        "jsonrpc": "2.0",
        "method": "SendMessage",
        "params": {"message": {"messageId": "n1", "role": "ROLE_USER", "parts": [{"text": "안녕"}]}},
    }
    answer = client.post("/a2a/company-assistant/", json.dumps(notification), content_type="application/json")
    assert answer.json()["error"]["code"] == -32600
    assert not Run.objects.exists()
    # A2A §3.6.2: no A2A-Version header is 0.3; a 0.3 client's method gets VERSION_NOT_SUPPORTED, not "not found".
    old = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}
    answer = client.post("/a2a/company-assistant/", json.dumps(old), content_type="application/json")
    assert answer.json()["error"]["code"] == -32009


def test_list_tasks_filters_pages_and_counts_as_a2a_says(api_caller: ApiCaller, demo_agent: Agent) -> None:
    """ListTasks ignored its status filter, said ``nextPageToken: ""`` (all there is) after any page, counted the
    page as the total and sent artifacts by default."""
    from django.db.models import F

    for i in range(5):
        Run.objects.create(agent=demo_agent, api_key=api_caller.key, query=f"질문 {i}", status=Run.Status.SUCCEEDED)
    Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="실패", status=Run.Status.FAILED)
    Run.objects.update(finished_at=F("created_at"))
    client = client_for(api_caller.raw_key)

    failed = rpc(client, "company-assistant", "ListTasks", {"status": "TASK_STATE_FAILED"})["result"]
    assert [t["status"]["state"] for t in failed["tasks"]] == ["TASK_STATE_FAILED"] and failed["totalSize"] == 1

    seen, token = [], None
    while True:
        page = rpc(client, "company-assistant", "ListTasks", {"pageSize": 2, **({"pageToken": token} if token else {})})
        page = page["result"]
        assert page["totalSize"] == 6 and len(page["tasks"]) <= 2
        assert all("artifacts" not in t for t in page["tasks"])
        seen += [t["id"] for t in page["tasks"]]
        token = page["nextPageToken"]
        if not token:
            break
    assert len(seen) == len(set(seen)) == 6
    newest_first = list(Run.objects.order_by("-finished_at", "-id").values_list("id", flat=True))
    assert seen == [str(i) for i in newest_first]
    with_artifacts = rpc(
        client,
        "company-assistant",
        "ListTasks",
        {"status": "TASK_STATE_COMPLETED", "pageSize": 1, "includeArtifacts": True},
    )["result"]
    assert "artifacts" in with_artifacts["tasks"][0]
    bad = rpc(client, "company-assistant", "ListTasks", {"pageToken": "not-ours"})
    assert bad["error"]["code"] == -32602
    no_date = rpc(client, "company-assistant", "ListTasks", {"statusTimestampAfter": "2024-13-45T00:00:00Z"})
    assert no_date["error"]["code"] == -32602  # it was an internal error (-32603)
    loose = rpc(client, "company-assistant", "ListTasks", {"pageSize": None, "includeArtifacts": None})["result"]
    assert loose["pageSize"] == 50 and all("artifacts" not in t for t in loose["tasks"])
