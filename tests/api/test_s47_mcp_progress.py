"""MCP ``tools/call`` on an event stream: every tool call of the run is told as a progress notification before the
result, however many arrive between two polls (a poll reads 200 events; those past the first read of a run that had
ended were never sent, and the progress counter had no gap to tell the caller so)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.signals import request_finished
from django.db import close_old_connections
from django.test import Client

from agents.api.mcp_server import EVENTS_READ, CallFeed
from agents.api.throttling import stream_slot_acquire, stream_slot_release
from agents.models import Agent, Run, RunEvent
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def quiet(db: Any) -> Agent:
    return make_agent(slug="quiet", servers=[], with_demo_rules=False)


def test_every_tool_call_past_one_read_is_told_before_the_result(api_caller: ApiCaller, quiet: Agent) -> None:
    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.RUNNING)
    calls = 2 * EVENTS_READ + 50
    RunEvent.objects.bulk_create(
        RunEvent(run=run, seq=1 + i, kind="tool_call", data={"tool": "lookup", "args": {"n": i}, "ok": True})
        for i in range(calls)
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, answer="완료")
    feed = CallFeed(run=run, rpc_id="c1", progress_token="p1")
    sent: list[dict[str, Any]] = []
    for _ in range(10):
        chunks, state = feed.poll()
        sent += [json.loads(c.split("data: ", 1)[1]) for c in chunks if c.startswith("event: message")]
        if state == "done":
            break
    progress = [m["params"]["progress"] for m in sent if m.get("method") == "notifications/progress"]
    assert progress == list(range(1, calls + 1))
    assert sent[-1]["id"] == "c1" and "완료" in json.dumps(sent[-1]["result"], ensure_ascii=False)


@pytest.mark.parametrize("accept", ["application/json, text/event-stream", "application/json"])
def test_a_call_whose_client_left_before_its_first_chunk_cancels_its_run_and_frees_its_slot(
    api_caller: ApiCaller, quiet: Agent, settings: Any, accept: str
) -> None:
    """The client went away while the answer's head was being sent: the server closes the response, whose body
    never began. Its run went on for nobody, and its slot was held until its lease ran out (the key's next call
    refused), as a client that leaves mid-stream has its run cancelled and its slot freed."""
    settings.PLATFORM_SSE_MAX_STREAMS_PER_KEY = 1
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ask_quiet", "arguments": {"query": "안녕"}},
    }
    response = client.post("/mcp/", json.dumps(body), content_type="application/json", headers={"Accept": accept})
    assert response.status_code == 200 and response.streaming, response.content
    run = Run.objects.get(agent=quiet)
    assert run.status == Run.Status.QUEUED
    request_finished.disconnect(close_old_connections)  # the test database kept open
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    slot = stream_slot_acquire(api_caller.key, lease_s=60)
    assert slot is not None
    stream_slot_release(slot)


def test_a_call_whose_runs_approvals_all_lapsed_goes_on_rather_than_end_waiting_for_none(
    api_caller: ApiCaller, quiet: Agent
) -> None:
    """A run parked on approvals all past their expiry (the reconciler has not expired them yet) asks nobody for
    anything: the call goes on with it (as A2A's task reads working), where it ended "waiting for approval" with no
    approval to decide. One with an approval still to decide ends so."""
    from datetime import timedelta

    from django.utils import timezone

    from agents.models import Approval

    run = Run.objects.create(agent=quiet, api_key=api_caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = Approval.objects.create(
        run=run,
        mcp_id="demo",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="b" * 64,
        expires_at=timezone.now() - timedelta(minutes=1),
    )
    assert CallFeed(run=run, rpc_id="c1", progress_token=None).poll()[1] == "wait"
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    chunks, state = CallFeed(run=run, rpc_id="c1", progress_token=None).poll()
    assert state == "done"
    assert "append_note" in chunks[-1]
