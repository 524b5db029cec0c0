"""The A2A and MCP servers against what a reviewer confirmed live (round 40):

1. a tool call's value and error text reached an A2A caller with hidden characters (tag characters, a zero-width
   space) as they came, while the answer wrote them out;
2. an approval's arguments were shown raw (a direction override) in the A2A and MCP texts an approver decides on;
3. A2A streams, a blocking SendMessage and an MCP call ended at a cancel before the run's worker recorded the call it
   was making (a write, perhaps) and the run's end;
4. their failure text was English for a Korean caller;
5. a tool error's CRLF read ``⟦U+000D⟧`` in the answer;
6. an MCP call cancelled by the client's ``notifications/cancelled`` was still answered;
8. a Korean text reply (``승인``/``거절``) to a task waiting for input was refused.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone, translation

from agents.answers import all_calls_failed_text
from agents.api.a2a_server import TaskFeed, TaskWait
from agents.api.mcp_server import CallFeed, call_result
from agents.error_texts import error_message_text
from agents.models import Agent, Approval, Run, RunEvent
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

HIDDEN_VALUE = {"name": "홍길동\u200b", "note": "줄1\r\n줄2\U000e0041\U000e0042", "rows": [{"k\u200b": "a\u202eb"}]}


@pytest.fixture
def quiet(db: Any) -> Agent:
    """An agent without servers or rules: no worker runs in these tests, the run's rows are written as its worker
    writes them."""
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def a2a(caller: ApiCaller, method: str, params: dict[str, Any], **headers: str) -> Any:
    body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client.post(
        "/a2a/quiet/", json.dumps(body), content_type="application/json", headers={"A2A-Version": "1.0", **headers}
    )


def mcp_call(caller: ApiCaller, accept: str) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "q"}},
    }
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    return client.post("/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": accept})


def sse_results(chunks: list[str]) -> list[dict[str, Any]]:
    return [json.loads(c.split("data: ", 1)[1]) for c in chunks if "data: " in c]


def tool_call_event(run: Run, seq: int, data: dict[str, Any]) -> None:
    RunEvent.objects.create(run=run, seq=seq, kind="tool_call", data=data)


def parked_with(run: Run, args: dict[str, Any]) -> Approval:
    return Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="create_ticket",
        args=args,
        call_hash="c".ljust(64, "0"),
        call_id="rule:1",
        expires_at=timezone.now() + timedelta(hours=1),
    )


def strings_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*strings_of(k), *strings_of(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


# --- 1. a tool call's value and error text, written out for the A2A caller -----------------------------------


def test_an_a2a_tool_call_update_writes_out_hidden_characters_and_the_event_keeps_them(quiet: Agent) -> None:
    run = Run.objects.create(agent=quiet, query="q", status=Run.Status.RUNNING)
    call = {
        "name": "lookup",
        "tool": "look\u202eup",
        "args": {"file": "invoice\u202efdp.exe"},
        "ok": False,
        "value": HIDDEN_VALUE,
        "tool_error_text": "틀림\U000e0049",
        "error": "tool:error",
    }
    tool_call_event(run, 1, call)
    chunks, state = TaskFeed(run=run, rpc_id=1, after=0, send_task=False).poll()
    assert state == "wait"
    [update] = sse_results(chunks)
    sent = update["result"]["statusUpdate"]["status"]["message"]["parts"][1]["data"]["toolCall"]
    assert sent["value"] == {
        "name": "홍길동⟦U+200B⟧",
        "note": "줄1\n줄2⟦U+E0041⟧⟦U+E0042⟧",  # the CRLF a line break, as the answer shows it
        "rows": [{"k⟦U+200B⟧": "a⟦U+202E⟧b"}],
    }
    assert sent["tool_error_text"] == "틀림⟦U+E0049⟧"
    assert sent["args"] == {"file": "invoice⟦U+202E⟧fdp.exe"} and sent["tool"] == "look⟦U+202E⟧up"
    assert not any(c in s for s in strings_of(sent) for c in "\u200b\u202e\U000e0041\U000e0049")
    assert RunEvent.objects.get(run=run, seq=1).data == call  # the record keeps what came


# --- 2. an approval's arguments as an approver reads them --------------------------------------------------------


def test_approval_texts_write_out_a_direction_override(api_caller: ApiCaller, quiet: Agent) -> None:
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    parked_with(run, {"title": "invoice\u202efdp.exe"})
    task = a2a(api_caller, "GetTask", {"id": str(run.pk)}).json()["result"]
    text = task["status"]["message"]["parts"][0]["text"]
    assert "invoice⟦U+202E⟧fdp.exe" in text and "\u202e" not in text
    mcp_text = call_result(run)["content"][0]["text"]
    assert "invoice⟦U+202E⟧fdp.exe" in mcp_text and "\u202e" not in mcp_text


# --- 3. a run cancelled while it ran is followed until its worker recorded its end -------------------------------


def cancelled_in_flight(agent: Agent, caller: ApiCaller) -> Run:
    """A run cancelled while its worker makes a tool call: it reads cancelled, its worker's pass has just begun, and
    neither the call nor the run's end (its ``cancelled`` status event) is recorded yet."""
    run = Run.objects.create(agent=agent, api_key=caller.key, query="q", status=Run.Status.RUNNING)
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running", "delivery": 1})
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.CANCELLED,
        error_code="cancelled",
        error_message="cancelled by api_key:x",
        pass_started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    return run


def the_worker_records_the_call_and_the_end(run: Run) -> None:
    tool_call_event(run, 2, {"name": "create_ticket", "ok": True, "value": "T-1"})
    RunEvent.objects.create(run=run, seq=3, kind="status", data={"status": "cancelled", "error": "cancelled"})


def test_an_a2a_stream_waits_for_the_call_a_cancelled_run_was_making(api_caller: ApiCaller, quiet: Agent) -> None:
    run = cancelled_in_flight(quiet, api_caller)
    feed = TaskFeed(run=run, rpc_id=1, after=1, send_task=False)
    chunks, state = feed.poll()
    assert (chunks, state) == ([], "wait")
    the_worker_records_the_call_and_the_end(run)
    chunks, state = feed.poll()
    assert state == "done"
    updates = [r["result"]["statusUpdate"]["status"] for r in sse_results(chunks)]
    assert updates[0]["message"]["parts"][1]["data"]["toolCall"]["name"] == "create_ticket"
    assert updates[-1]["state"] == "TASK_STATE_CANCELED"


def test_a_blocking_send_message_waits_for_the_call_a_cancelled_run_was_making(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    run = cancelled_in_flight(quiet, api_caller)
    wait = TaskWait(run=run, rpc_id=1, history_length=0)
    chunks, state = wait.poll()
    assert state == "wait" and not sse_results(chunks)
    the_worker_records_the_call_and_the_end(run)
    chunks, state = wait.poll()
    assert state == "done"
    assert sse_results(chunks)[0]["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED"


def test_an_mcp_call_waits_for_the_call_a_cancelled_run_was_making(api_caller: ApiCaller, quiet: Agent) -> None:
    run = cancelled_in_flight(quiet, api_caller)
    feed = CallFeed(run=run, rpc_id=1, progress_token="p")
    chunks, state = feed.poll()
    assert state == "wait" and not any('"result"' in c for c in chunks)
    the_worker_records_the_call_and_the_end(run)
    chunks, state = feed.poll()
    assert state == "done"
    progress = [r["params"]["message"] for r in sse_results(chunks) if "params" in r]
    assert any("create_ticket" in line for line in progress)  # in the run's language
    assert sse_results(chunks)[-1]["result"]["isError"] is True


# --- 4. failure text in the caller's language ----------------------------------------------------------------------


def test_failure_texts_are_in_the_callers_language(api_caller: ApiCaller, quiet: Agent) -> None:
    message = "the run did not finish within its time limit"
    run = Run.objects.create(
        agent=quiet,
        api_key=api_caller.key,
        query="q",
        status=Run.Status.FAILED,
        error_code="time_limit",
        error_message=message,
    )
    with translation.override("ko"):
        korean = error_message_text("time_limit", message)
        assert korean != message
        assert call_result(run)["content"][0]["text"].endswith(f"time_limit: {korean}")
    task = a2a(api_caller, "GetTask", {"id": str(run.pk)}, **{"Accept-Language": "ko"}).json()["result"]
    assert task["status"]["message"]["parts"][0]["text"] == f"time_limit: {korean}"
    assert task["metadata"]["error"]["message"] == message  # the stored message, as the data part keeps it
    with translation.override("ko"):
        assert error_message_text("cancelled", "cancelled by api_key:ab12 (cancelled)") != (
            "cancelled by api_key:ab12 (cancelled)"
        )


# --- 5. a tool error's CRLF --------------------------------------------------------------------------------------


def test_a_tool_errors_crlf_is_a_line_break_and_a_lone_cr_is_written_out() -> None:
    failed = [{"tool": "lookup", "error": "tool:error", "tool_error_text": "줄1\r\n줄2\r숨김\U000e0041"}]
    text = all_calls_failed_text(results=failed, language="en")
    assert "줄1\n줄2⟦U+000D⟧숨김⟦U+E0041⟧" in text


# --- 6. an MCP call cancelled by its client is not answered ------------------------------------------------------


def test_an_mcp_call_cancelled_by_notification_ends_its_stream_without_an_answer(
    api_caller: ApiCaller, quiet: Agent, settings: Any
) -> None:
    settings.PLATFORM_SSE_POLL_S = 0.01
    settings.PLATFORM_SSE_KEEPALIVE_S = 0
    response = mcp_call(api_caller, "application/json, text/event-stream")
    answer = response._iterator
    next(answer)
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    notice = client.post("/mcp/", json.dumps(cancelled), content_type="application/json")
    assert notice.status_code == 202
    rest = [c.decode() if isinstance(c, bytes) else c for c in answer]
    assert Run.objects.get().status == Run.Status.CANCELLED
    assert not [m for m in sse_results(rest) if m.get("id") == 3]


def test_an_mcp_call_on_a_json_body_is_still_answered_once_cancelled(
    api_caller: ApiCaller, quiet: Agent, settings: Any
) -> None:
    """A JSON body began with its 200 and must be one JSON-RPC message: it ends with the call's answer."""
    settings.PLATFORM_SSE_POLL_S = 0.01
    settings.PLATFORM_SSE_KEEPALIVE_S = 0
    answer = mcp_call(api_caller, "application/json")._iterator
    next(answer)
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    client.post("/mcp/", json.dumps(cancelled), content_type="application/json")
    body = "".join(c.decode() if isinstance(c, bytes) else c for c in answer)
    assert json.loads(body)["id"] == 3


# --- 8. a Korean text reply decides -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("승인", Approval.Status.APPROVED),
        (" 승인합니다\n", Approval.Status.APPROVED),
        ("거절", Approval.Status.REJECTED),
        ("거절합니다", Approval.Status.REJECTED),
        (unicodedata.normalize("NFD", "승인"), Approval.Status.APPROVED),  # as macOS writes it
    ],
)
def test_a_korean_reply_decides(api_caller: ApiCaller, quiet: Agent, reply: str, status: str) -> None:
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = parked_with(run, {"title": "회의록"})
    message = {"messageId": "m-1", "taskId": str(run.pk), "parts": [{"text": reply}]}
    answer = a2a(api_caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})
    assert "error" not in answer.json()
    approval.refresh_from_db()
    assert approval.status == status


@pytest.mark.parametrize("reply", ["승인 안 함", "승인해 주세요", "거절하지 마"])
def test_a_korean_reply_that_only_contains_a_decision_word_decides_nothing(
    api_caller: ApiCaller, quiet: Agent, reply: str
) -> None:
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = parked_with(run, {"title": "회의록"})
    message = {"messageId": "m-1", "taskId": str(run.pk), "parts": [{"text": reply}]}
    answer = a2a(api_caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})
    assert answer.json()["error"]["data"][0]["metadata"]["code"] == "decision_missing"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
