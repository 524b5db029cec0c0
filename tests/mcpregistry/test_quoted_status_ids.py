"""A question about asset 429 or 504 on the demo server (its "unknown asset" error quotes the id first) is a tool
error: one attempt, no backoff, nothing counted by the breaker, and the next tool of that server still answers.
Before, the two calls were retried as a rate limit and a timeout and opened the circuit for every caller."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from mcpregistry.pool import get_default_pool
from tests.conftest import FakeClock, bind_demo_server, make_agent

pytestmark = pytest.mark.django_db


@pytest.mark.slow
def test_unknown_assets_named_429_and_504_are_tool_errors_and_open_no_circuit(gate_clock: FakeClock) -> None:
    server = bind_demo_server(mcp_id="numeric-ids", failure_mode="none")
    script = [
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "429"}}]},
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "504"}}]},
        {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}]},
        {"content": "답: {last_tool_result}"},
    ]
    agent = make_agent(slug="numeric-ids", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="429번, 504번 자산 상태와 물류플랫폼팀 프로젝트")
    try:
        run_execute(run_id=str(run.id))
    finally:
        get_default_pool().close(server.mcp_id)

    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id")
    assert list(calls.values_list("tool", "reason")) == [
        ("get_asset_status", "tool:error"),
        ("get_asset_status", "tool:error"),
        ("list_projects", ""),
    ]
    assert gate_clock.slept == []  # no backoff
