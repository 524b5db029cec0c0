"""An open stream ends once its key may no longer read the run (review defect: a stream only rechecked that its
key was not revoked, and ran on until ``PLATFORM_SSE_MAX_S`` after the key was taken off the run's agent or the
agent was disabled, while every REST request was already a ``404 run_not_found``). At each recheck the stream
asks the REST views' own rule (``run_get``, through ``key_may_read_run``) and ends with a translated last event:
the run events API's ``event: error`` ``run_not_found``, A2A's -32001 ``TASK_NOT_FOUND`` error, an MCP call's
``isError`` result. The run is left alone, and the rule is asked once per recheck interval, no more."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agents.api import protocol_http
from agents.models import Agent, ApiKey, Run
from agents.services import agent_update, api_key_create, api_key_update
from tests.api.test_protocol_defects import rest_of as protocol_rest_of
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
A2A = "/a2a/company-assistant/"
CLOSED = "This API key may no longer read this run; the stream is closed."


@pytest.fixture
def fast_streams(settings: Any) -> Any:
    settings.PLATFORM_SSE_POLL_S = 0.05
    settings.PLATFORM_SSE_KEEPALIVE_S = 0.1
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 0.2
    settings.PLATFORM_SSE_MAX_S = 600  # any stream these tests see end was ended by its recheck, not the cap
    return settings


@pytest.fixture
def other_agent(db: Any) -> Agent:
    return make_agent(slug="other", servers=[], with_demo_rules=False)


def scoped_key(agent: Agent) -> tuple[ApiKey, str]:
    return api_key_create(actor="test", via="tests", name="scoped", agents=[agent])


def narrow(key: ApiKey, to: Agent) -> None:
    api_key_update(api_key=key, actor="test", via="tests", agents=[to])


def disable(agent: Agent) -> None:
    agent_update(agent=agent, actor="test", via="tests", data={"enabled": False})


def sse_data(text: str) -> list[Any]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def rest_of(chunks: Any) -> str:
    """What the stream sends until it ends by itself (``test_protocol_defects.rest_of``: one still open after a
    minute, the cap ten minutes off, has missed the end the test waits for, and fails it)."""
    return protocol_rest_of(iter(chunks)).decode()


# --- the run events API -----------------------------------------------------------------------------------


@pytest.mark.parametrize("taken_off", [narrow, disable], ids=["key narrowed", "agent disabled"])
def test_a_run_event_stream_ends_with_run_not_found_once_its_key_may_no_longer_read_the_run(
    demo_agent: Agent, other_agent: Agent, fast_streams: Any, taken_off: Any
) -> None:
    key, raw = scoped_key(demo_agent)
    run = Run.objects.create(agent=demo_agent, api_key=key, query="휴가 신청", status=Run.Status.RUNNING)
    response: Any = Client().get(f"{RUNS}/{run.pk}/events", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 200
    chunks = iter(response.streaming_content)
    assert next(chunks).startswith(b"retry:")
    if taken_off is narrow:
        narrow(key, other_agent)
    else:
        disable(demo_agent)
    rest = rest_of(chunks)
    last = rest.strip().split("\n\n")[-1]
    assert last.startswith("event: error\n"), rest
    assert json.loads(last.split("data: ", 1)[1]) == {"code": "run_not_found", "message": CLOSED}
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING  # the run is left alone
    again = Client().get(f"{RUNS}/{run.pk}/events", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert again.status_code == 404  # what the stream said is what a new request is told
    assert again.json()["error"]["code"] == "run_not_found"


# --- A2A ----------------------------------------------------------------------------------------------------


def a2a(client: Client, method: str, params: dict[str, Any], rpc_id: Any = "r1") -> Any:
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}
    return client.post(A2A, json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0"})


def test_an_a2a_subscription_ends_with_task_not_found_once_its_key_is_taken_off_the_agent(
    demo_agent: Agent, other_agent: Agent, fast_streams: Any
) -> None:
    key, raw = scoped_key(demo_agent)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    message = {"messageId": "m-scope", "role": "ROLE_USER", "parts": [{"text": "안녕하세요"}]}
    task = a2a(client, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}}).json()
    task_id = task["result"]["task"]["id"]
    response = a2a(client, "SubscribeToTask", {"id": task_id}, rpc_id="sub-1")
    chunks = iter(response.streaming_content)
    assert b'"task"' in next(chunks)
    narrow(key, other_agent)
    last = sse_data(rest_of(chunks))[-1]
    assert last["id"] == "sub-1" and "result" not in last
    assert last["error"]["code"] == -32001
    assert last["error"]["data"][0]["reason"] == "TASK_NOT_FOUND"
    assert last["error"]["data"][0]["metadata"]["code"] == "run_not_found"
    assert last["error"]["message"] == CLOSED
    assert Run.objects.get().status == Run.Status.QUEUED


def test_an_a2a_streaming_message_stops_once_its_agent_is_disabled(demo_agent: Agent, fast_streams: Any) -> None:
    _key, raw = scoped_key(demo_agent)
    message = {"messageId": "m-scope-2", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    response = a2a(Client(HTTP_AUTHORIZATION=f"Bearer {raw}"), "SendStreamingMessage", {"message": message})
    chunks = iter(response.streaming_content)
    next(chunks)
    disable(demo_agent)
    assert sse_data(rest_of(chunks))[-1]["error"]["code"] == -32001


# --- MCP ----------------------------------------------------------------------------------------------------


def mcp_call(raw: str, *, accept: str) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "q"}},
    }
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": accept}
    )


def test_an_mcp_call_stream_ends_with_an_error_result_once_its_key_is_taken_off_the_agent(
    other_agent: Agent, fast_streams: Any
) -> None:
    quiet = make_agent(slug="quiet", servers=[], with_demo_rules=False)
    key, raw = scoped_key(quiet)
    chunks = iter(mcp_call(raw, accept="application/json, text/event-stream").streaming_content)
    next(chunks)
    narrow(key, other_agent)
    last = sse_data(rest_of(chunks))[-1]
    assert last["id"] == 1 and last["result"]["isError"] is True
    assert "structuredContent" not in last["result"]  # nothing of the run it may no longer read
    assert last["result"]["content"][0]["text"] == f"run_not_found: {CLOSED}"
    assert Run.objects.get().status == Run.Status.QUEUED


def test_a_json_only_mcp_call_ends_with_an_error_result_once_its_agent_is_disabled(fast_streams: Any) -> None:
    quiet = make_agent(slug="quiet", servers=[], with_demo_rules=False)
    _key, raw = scoped_key(quiet)
    chunks = iter(mcp_call(raw, accept="application/json").streaming_content)
    assert next(chunks) == b" "
    disable(quiet)
    answer = json.loads(rest_of(chunks))
    assert answer["result"]["isError"] is True
    assert answer["result"]["content"][0]["text"].startswith("run_not_found: ")


# --- the cost: one check per interval ------------------------------------------------------------------------


def test_a_recheck_asks_whether_the_run_is_readable_only_every_interval(demo_agent: Agent, settings: Any) -> None:
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 10
    key, _raw = scoped_key(demo_agent)
    now = [1000.0]
    asked: list[float] = []
    readable = [True]

    def still_readable() -> bool:
        asked.append(now[0])
        return readable[0]

    recheck = protocol_http.KeyRecheck(
        key, None, run_id="unused", clock=lambda: now[0], still_authorized=lambda: True, still_readable=still_readable
    )
    for step in (0, 5, 5, 5, 5):  # asked at 1010 and 1020 only
        now[0] += step
        assert recheck.lost() is None
    readable[0] = False
    now[0] += 9
    assert recheck.lost() is None  # not asked yet
    now[0] += 1
    assert recheck.lost() == "run_not_found"
    assert asked == [1010.0, 1020.0, 1030.0]


def test_a_revoked_key_is_told_so_before_the_run_is_asked_about(demo_agent: Agent, settings: Any) -> None:
    settings.PLATFORM_SSE_AUTH_RECHECK_S = 10
    key, _raw = scoped_key(demo_agent)
    now = [1000.0]
    recheck = protocol_http.KeyRecheck(
        key, None, run_id="unused", clock=lambda: now[0], still_authorized=lambda: False, still_readable=lambda: False
    )
    now[0] += 10
    assert recheck.lost() == "revoked"


def test_key_may_read_run_is_the_rest_views_rule(demo_agent: Agent, other_agent: Agent) -> None:
    key, _raw = scoped_key(demo_agent)
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q", status=Run.Status.RUNNING)
    assert protocol_http.key_may_read_run(api_key=key, run_id=run.pk) is True
    other_key, _other_raw = api_key_create(actor="test", via="tests", name="someone else")
    assert protocol_http.key_may_read_run(api_key=other_key, run_id=run.pk) is False
    narrow(key, other_agent)
    assert protocol_http.key_may_read_run(api_key=key, run_id=run.pk) is False
    narrow(key, demo_agent)
    assert protocol_http.key_may_read_run(api_key=key, run_id=run.pk) is True
