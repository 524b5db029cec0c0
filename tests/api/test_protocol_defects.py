"""The A2A and MCP endpoints against a reviewer's findings: a stream re-checks its key (a revoked key loses its
updates and its result at once) and holds its slot on a short, renewed lease; a JSON-only MCP call counts against
the key's streams; out-of-range timestamps and over-long ids are refused as bad input (never an internal error);
an MCP request whose method is not text is an Invalid Request; an MCP result speaks the caller's language."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone, translation

from agents.api import protocol_http
from agents.api.mcp_server import call_result
from agents.api.throttling import stream_slot_acquire, stream_slot_release
from agents.models import Agent, Approval, Run
from agents.services import api_key_revoke
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

A2A = "/a2a/company-assistant/"


def client_for(raw_key: str, **extra: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}", **extra)


def a2a(client: Client, method: str, params: dict[str, Any], rpc_id: Any = "r1") -> Any:
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}
    return client.post(A2A, json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0"})


def mcp_call(client: Client, *, accept: str, rpc_id: int = 1) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "q"}},
    }
    return client.post("/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": accept})


def sse_data(text: str) -> list[Any]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.fixture
def fast_streams(settings: Any) -> Any:
    """Quick polls, keep-alives and key checks, and the cap (``PLATFORM_SSE_MAX_S``) ten minutes off: a stream
    these tests see end was ended by what they test, never by the cap, so no test tells the two apart by time."""
    settings.PLATFORM_SSE_POLL_S = 0.05
    settings.PLATFORM_SSE_KEEPALIVE_S = 0.1
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 0.2
    settings.PLATFORM_SSE_MAX_S = 600
    return settings


def rest_of(chunks: Iterator[bytes], *, hang_s: float = 60) -> bytes:
    """The rest of a stream that must end by itself. With the cap ten minutes off, one still open after
    ``hang_s`` has missed the end the test waits for: the test fails then instead of hanging until the cap. A
    bound on a hang, not a speed check (a keep-alive every 0.1 s gives the check its turns); read on the test's
    own thread, where its database transaction is."""
    deadline = time.monotonic() + hang_s
    received: list[bytes] = []
    for chunk in chunks:
        received.append(chunk)
        if time.monotonic() > deadline:
            pytest.fail(f"the stream did not end: ...{b''.join(received)[-400:]!r}")
    return b"".join(received)


# --- 1. a stream re-checks its key and renews its short lease ----------------------------------------------


def test_an_a2a_subscription_of_a_revoked_key_ends_with_an_authentication_error(
    api_caller: ApiCaller, demo_agent: Agent, fast_streams: Any
) -> None:
    client = client_for(api_caller.raw_key, HTTP_ACCEPT_LANGUAGE="ko")
    message = {"messageId": "m-rev", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    task = a2a(client, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}}).json()
    response = a2a(client, "SubscribeToTask", {"id": task["result"]["task"]["id"]}, rpc_id="sub-1")
    assert response["Content-Type"].startswith("text/event-stream")
    chunks = iter(response.streaming_content)
    assert b'"task"' in next(chunks)
    api_key_revoke(api_key=api_caller.key, actor="test", via="tests")
    last = sse_data(rest_of(chunks).decode())[-1]
    assert last["id"] == "sub-1" and "result" not in last
    assert last["error"]["code"] == -32030
    assert last["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
    assert last["error"]["data"][0]["metadata"]["code"] == "authentication_failed"
    assert last["error"]["message"] == "API 키가 폐기되어 스트림을 닫았습니다."  # the caller's language
    assert Run.objects.get().status == Run.Status.QUEUED  # the run is left alone


def test_an_a2a_streaming_message_of_a_revoked_key_stops(
    api_caller: ApiCaller, demo_agent: Agent, fast_streams: Any
) -> None:
    message = {"messageId": "m-rev-2", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    response = a2a(client_for(api_caller.raw_key), "SendStreamingMessage", {"message": message})
    chunks = iter(response.streaming_content)
    next(chunks)
    api_key_revoke(api_key=api_caller.key, actor="test", via="tests")
    last = sse_data(rest_of(chunks).decode())[-1]
    assert "result" not in last and last["error"]["code"] == -32030
    assert last["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
    assert last["error"]["data"][0]["metadata"]["code"] == "authentication_failed"


def test_an_mcp_stream_of_a_revoked_key_ends_with_an_error_result(api_caller: ApiCaller, fast_streams: Any) -> None:
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    response = mcp_call(client_for(api_caller.raw_key), accept="application/json, text/event-stream")
    chunks = iter(response.streaming_content)
    next(chunks)
    api_key_revoke(api_key=api_caller.key, actor="test", via="tests")
    last = sse_data(rest_of(chunks).decode())[-1]
    assert last["id"] == 1 and last["result"]["isError"] is True
    assert "structuredContent" not in last["result"]  # nothing of the run is sent to a revoked key
    assert last["result"]["content"][0]["text"].startswith("authentication_failed: ")
    assert Run.objects.get().status == Run.Status.QUEUED


def test_a_json_only_mcp_call_of_a_revoked_key_ends_with_an_error_result(
    api_caller: ApiCaller, fast_streams: Any
) -> None:
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    response = mcp_call(client_for(api_caller.raw_key), accept="application/json")
    chunks = iter(response.streaming_content)
    assert next(chunks) == b" "
    api_key_revoke(api_key=api_caller.key, actor="test", via="tests")
    answer = json.loads(rest_of(chunks))
    assert answer["id"] == 1 and answer["result"]["isError"] is True
    assert "structuredContent" not in answer["result"]  # nothing of the run is sent to a revoked key
    assert answer["result"]["content"][0]["text"].startswith("authentication_failed: ")


@pytest.mark.slow
def test_a_protocol_stream_takes_its_slot_on_the_short_lease_and_renews_it(
    api_caller: ApiCaller, demo_agent: Agent, fast_streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed web process frees its slots within a minute (the run events API's lease), not after
    PLATFORM_SSE_MAX_S + 60 s: the lease is short, and each re-check of the key renews it."""
    fast_streams.PLATFORM_SSE_MAX_S = 0.6
    leases: list[float] = []
    renewals: list[float] = []
    real_acquire = protocol_http.stream_slot_acquire

    def acquire(api_key: Any, *, lease_s: float) -> Any:
        leases.append(lease_s)
        return real_acquire(api_key, lease_s=lease_s)

    monkeypatch.setattr(protocol_http, "stream_slot_acquire", acquire)
    monkeypatch.setattr(protocol_http, "stream_slot_renew", lambda slot, *, lease_s: renewals.append(lease_s))
    short = 2 * 0.2 + 0.05 + 5
    client = client_for(api_caller.raw_key)
    message = {"messageId": "m-lease", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    b"".join(a2a(client, "SendStreamingMessage", {"message": message}).streaming_content)
    assert leases == [pytest.approx(short)]
    assert renewals and renewals == [pytest.approx(short)] * len(renewals)
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    renewals.clear()
    for n, accept in enumerate(("application/json, text/event-stream", "application/json"), start=2):
        b"".join(mcp_call(client, accept=accept, rpc_id=n).streaming_content)
    assert leases == [pytest.approx(short)] * 3
    assert renewals and renewals == [pytest.approx(short)] * len(renewals)


def test_a_key_recheck_asks_again_only_every_interval(api_caller: ApiCaller, settings: Any) -> None:
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 10
    now = [1000.0]
    live = [True]
    recheck = protocol_http.KeyRecheck(
        api_caller.key, None, run_id="unused", clock=lambda: now[0], still_authorized=lambda: live[0]
    )
    assert recheck.lost() is None
    live[0] = False
    now[0] += 9
    assert recheck.lost() is None  # not asked yet
    now[0] += 1
    assert recheck.lost() == "revoked"


# --- 2. a JSON-only MCP call takes a stream slot -------------------------------------------------------------


def test_a_json_only_mcp_call_is_refused_without_a_free_slot(api_caller: ApiCaller, settings: Any) -> None:
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    held = stream_slot_acquire(api_caller.key, lease_s=60)
    assert held is not None
    try:
        plain = mcp_call(client_for(api_caller.raw_key), accept="application/json")
        assert not plain.streaming and plain.status_code == 200
        result = plain.json()["result"]
        assert result["isError"] is True and result["content"][0]["text"].startswith("too_many_streams: ")
        assert not Run.objects.exists()
    finally:
        stream_slot_release(held)


def test_a_json_only_mcp_call_holds_a_slot_while_open_and_frees_it(api_caller: ApiCaller, settings: Any) -> None:
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    settings.PLATFORM_SSE_POLL_S = 0.02
    settings.PLATFORM_SSE_MAX_S = 0.3
    make_agent(slug="quiet", servers=[], with_demo_rules=False)
    client = client_for(api_caller.raw_key)
    first = mcp_call(client, accept="application/json")
    chunks = iter(first.streaming_content)
    next(chunks)  # open: it holds the key's only slot
    refused = mcp_call(client, accept="application/json, text/event-stream", rpc_id=2)
    assert refused.json()["result"]["isError"] is True
    assert json.loads(b"".join(chunks))["result"]["structuredContent"]["status"] == "queued"
    slot = stream_slot_acquire(api_caller.key, lease_s=60)  # given back when the answer ended
    assert slot is not None
    stream_slot_release(slot)


# --- 3. ListTasks: out-of-range timestamps are invalid params ------------------------------------------------


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_list_tasks_timestamp_out_of_range_is_invalid_params(
    api_caller: ApiCaller, demo_agent: Agent, moment: str, caplog: pytest.LogCaptureFixture
) -> None:
    answer = a2a(client_for(api_caller.raw_key), "ListTasks", {"statusTimestampAfter": moment}).json()
    assert answer["error"]["code"] == -32602, answer
    assert "statusTimestampAfter" in answer["error"]["message"]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_list_tasks_forged_page_token_out_of_range_is_invalid_params(
    api_caller: ApiCaller, demo_agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    token = base64.urlsafe_b64encode(b"0001-01-01T00:00:00+01:00|00000000-0000-0000-0000-000000000000").decode()
    answer = a2a(client_for(api_caller.raw_key), "ListTasks", {"pageToken": token}).json()
    assert answer["error"]["code"] == -32602, answer
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_list_tasks_still_reads_naive_and_offset_timestamps(api_caller: ApiCaller, demo_agent: Agent) -> None:
    Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", status=Run.Status.QUEUED)
    client = client_for(api_caller.raw_key)
    for moment in ("2000-01-01T00:00:00", "2000-01-01T09:00:00+09:00", "0001-01-01T00:00:00Z"):
        assert a2a(client, "ListTasks", {"statusTimestampAfter": moment}).json()["result"]["totalSize"] == 1
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    assert a2a(client, "ListTasks", {"statusTimestampAfter": later}).json()["result"]["totalSize"] == 0


# --- 4. an A2A request id is bounded ---------------------------------------------------------------------


def test_an_a2a_request_id_over_200_characters_is_an_invalid_request(api_caller: ApiCaller, demo_agent: Agent) -> None:
    client = client_for(api_caller.raw_key)
    response = a2a(client, "GetTask", {"id": "x"}, rpc_id="i" * 200_000)
    assert len(response.content) < 10_000
    answer = response.json()
    assert (answer["id"], answer["error"]["code"]) == (None, -32600)
    assert a2a(client, "GetTask", {"id": "x"}, rpc_id="i" * 201).json()["error"]["code"] == -32600
    fits = a2a(client, "GetTask", {"id": "x"}, rpc_id="i" * 200).json()
    assert fits["id"] == "i" * 200 and fits["error"]["code"] == -32001  # answered: no such task


# --- 5. an MCP result speaks the caller's language -----------------------------------------------------------


def test_an_mcp_result_for_a_parked_failed_or_unfinished_run_is_in_the_callers_language(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    parked = Run.objects.create(
        agent=demo_agent, api_key=api_caller.key, query="메모 저장", status=Run.Status.AWAITING_APPROVAL
    )
    Approval.objects.create(
        run=parked,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="a" * 64,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    failed = Run.objects.create(
        agent=demo_agent,
        api_key=api_caller.key,
        query="q",
        status=Run.Status.FAILED,
        error_code="model_error",
        error_message="boom",
    )
    running = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", status=Run.Status.RUNNING)
    with translation.override("ko"):
        labels = {run.pk: str(Run.Status(run.status).label) for run in (parked, failed, running)}
        texts = {run.pk: call_result(run)["content"][0]["text"] for run in (parked, failed, running)}
    assert not texts[parked.pk].startswith("awaiting approval:"), texts  # was a hard-coded English f-string
    assert texts[parked.pk].startswith(f"{labels[parked.pk]}: append_note "), texts
    assert f"/api/v1/runs/{parked.pk}/approvals/" in texts[parked.pk]
    assert texts[failed.pk] == f"{labels[failed.pk]}: model_error: boom"
    assert texts[running.pk] == f"상태: {labels[running.pk]}"
    assert labels[running.pk] != "running"  # the label, not the raw status value


# --- 6. an MCP method that is not text is an Invalid Request -------------------------------------------------


@pytest.mark.parametrize("method", [{"x": 1}, ["tools/list"], 7, None])
def test_an_mcp_request_whose_method_is_not_text_is_an_invalid_request(api_caller: ApiCaller, method: Any) -> None:
    client = client_for(api_caller.raw_key)
    body = {"jsonrpc": "2.0", "id": 5, "method": method}
    answer = client.post("/mcp/", json.dumps(body), content_type="application/json").json()
    assert (answer["id"], answer["error"]["code"]) == (5, -32600), answer
    assert "{'x'" not in answer["error"]["message"]
    notification = client.post(
        "/mcp/", json.dumps({"jsonrpc": "2.0", "method": method}), content_type="application/json"
    )
    assert (notification.json()["id"], notification.json()["error"]["code"]) == (None, -32600)
    # A response (no method at all) is still taken without a word.
    response = {"jsonrpc": "2.0", "id": 9, "result": {}}
    assert client.post("/mcp/", json.dumps(response), content_type="application/json").status_code == 202
