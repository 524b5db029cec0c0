"""The A2A endpoint's streams, as a reviewer found them (s47):

1. a stream (``SubscribeToTask``, ``SendStreamingMessage``) whose client left before its first chunk held its
   stream slot until the slot's lease ran out: Django closes the response, but a generator that never started runs
   no ``finally``, so the key's other streams were refused meanwhile (``PLATFORM_SSE_MAX_STREAMS_PER_KEY``);
2. a run with more tool calls between two polls than one read takes (200) is streamed whole, in order, before the
   task's last status: no call is left out of what the caller sees.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.core.signals import request_finished
from django.db import close_old_connections
from django.test import Client

from agents.api.throttling import stream_slot_acquire, stream_slot_release
from agents.models import Agent, Run, RunEvent
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def quiet(db: Any) -> Agent:
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def rpc_body(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": "s1", "method": method, "params": params}).encode()


def subscribe(caller: ApiCaller, run: Run) -> Any:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    body = rpc_body("SubscribeToTask", {"id": str(run.pk)})
    return client.post("/a2a/quiet/", body, content_type="application/json", headers={"A2A-Version": "1.0"})


def closed(response: Any) -> None:
    """Close ``response`` as a server does when its client has gone, the test database kept open (the test client
    closes the connection on ``request_finished``)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def slot_is_free(caller: ApiCaller) -> bool:
    slot = stream_slot_acquire(caller.key, lease_s=60)
    if slot is None:
        return False
    stream_slot_release(slot)
    return True


def test_a_stream_closed_before_its_first_chunk_gives_its_slot_back(
    api_caller: ApiCaller, quiet: Agent, settings: Any
) -> None:
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.RUNNING)
    first = subscribe(api_caller, run)
    assert first.status_code == 200 and first.streaming, first.content
    closed(first)  # the client went away: the server closes the response, never having read from it
    second = subscribe(api_caller, run)
    assert second.status_code == 200, second.content
    assert second.streaming
    closed(second)
    assert slot_is_free(api_caller)


def a2a_post_scope(body: bytes, *, raw_key: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/a2a/quiet/",
        "raw_path": b"/a2a/quiet/",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"accept", b"text/event-stream"),
            (b"a2a-version", b"1.0"),
            (b"authorization", f"Bearer {raw_key}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("method", ["SubscribeToTask", "SendStreamingMessage"])
def test_an_asgi_stream_whose_client_leaves_before_its_first_chunk_gives_its_slot_back(
    api_caller: ApiCaller, quiet: Agent, settings: Any, method: str
) -> None:
    """Under ASGI: the client disconnects while the response's head is being sent; Django cancels the sending
    and closes the response, whose stream never started."""
    from agent_platform.asgi import application

    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    settings.PLATFORM_SSE_POLL_S = 0.05
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.RUNNING)
    if method == "SubscribeToTask":
        params: dict[str, Any] = {"id": str(run.pk)}
    else:
        params = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "안녕하세요"}]}}
    body = rpc_body(method, params)
    taken = False
    head_sent = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if not taken:
            taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        await head_sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.start":
            head_sent.set()
            await asyncio.Event().wait()  # the head never reaches the client, who leaves meanwhile

    asyncio.run(asyncio.wait_for(application(a2a_post_scope(body, raw_key=api_caller.raw_key), receive, send), 30))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert [m for m in sent if m["type"] == "http.response.body"] == []  # no chunk was ever sent
    assert slot_is_free(api_caller)


# --- more tool calls between two polls than one read takes ---------------------------------------------------


def events_of(response: Any) -> list[dict[str, Any]]:
    text = b"".join(response.streaming_content).decode()
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_run_with_more_calls_than_one_read_streams_every_call_in_order_before_its_end(
    api_caller: ApiCaller, quiet: Agent, settings: Any
) -> None:
    settings.PLATFORM_SSE_POLL_S = 0
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.RUNNING)
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running"})
    response = subscribe(api_caller, run)
    assert response.status_code == 200
    chunks = iter(response.streaming_content)
    first = json.loads(next(chunks).decode()[len("data: ") :])
    assert first["result"]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    calls = 450
    RunEvent.objects.bulk_create(
        RunEvent(
            run=run, seq=2 + i, kind="tool_call", data={"tool": "lookup", "args": {"n": i}, "ok": True, "value": "조회"}
        )
        for i in range(calls)
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, answer="완료")
    rest = b"".join(chunks).decode()
    sent = [json.loads(line[len("data: ") :]) for line in rest.splitlines() if line.startswith("data: ")]
    updates = [s["result"]["statusUpdate"] for s in sent if "statusUpdate" in s["result"]]
    tool_calls = [u["status"]["message"]["parts"][1]["data"]["toolCall"] for u in updates if "message" in u["status"]]
    assert [c["args"]["n"] for c in tool_calls[:calls]] == list(range(calls))
    assert tool_calls[0]["value"] == "조회"
    assert "artifactUpdate" in sent[-2]["result"]
    assert updates[-1]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "조회" in rest  # Korean as it is, not \\uXXXX escapes
