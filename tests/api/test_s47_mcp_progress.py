"""MCP ``tools/call`` on an event stream: every tool call of the run is told as a progress notification before the
result, however many arrive between two polls (a poll reads 200 events; those past the first read of a run that had
ended were never sent, and the progress counter had no gap to tell the caller so)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.api.mcp_server import EVENTS_READ, CallFeed
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
