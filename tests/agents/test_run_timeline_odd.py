"""The run pages never fail on an odd stored trace: a run's page, its timeline fragment, an approval's page (the
run so far beside it) and the list of runs each answer, whatever shape a stored entry, tool call, timing or token
count has."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Agent, Approval, Run

pytestmark = pytest.mark.django_db

ODD: dict[str, dict[str, Any]] = {
    "messages_an_object": {"messages": {"type": "ai"}},
    "messages_a_text": {"messages": "hello"},
    "entries_not_objects": {"messages": ["hello", None, 3, ["a"]]},
    "a_tool_call_without_a_name": {
        "messages": [{"type": "ai", "content": "", "tool_calls": [{"id": "x", "args": {}}]}]
    },
    "a_tool_call_a_text": {"messages": [{"type": "ai", "content": "", "tool_calls": ["x"]}]},
    "tool_calls_an_object": {"messages": [{"type": "ai", "content": "", "tool_calls": {"a": 1}}]},
    "a_type_a_list": {"messages": [{"type": ["x"]}]},
    "rule_params_a_text": {"messages": [{"type": "rule", "rule": "r", "matched": True, "params": "p"}]},
    "a_latency_a_text": {
        "messages": [{"type": "deterministic_call", "args": [1, 2], "ok": True, "value": 1, "latency_ms": "fast"}]
    },
    "fallback_for_an_object": {"messages": [{"type": "deterministic_call", "ok": True, "fallback_for": {"x": 1}}]},
    "timings_a_list": {"timings": [1, 2]},
    "total_ms_a_text": {"timings": {"total_ms": "12"}},
    "token_usage_a_list": {"token_usage": [1]},
    "tool_errors_a_text": {"messages": [{"type": "outcome", "reason": None, "tool_errors": "abc"}]},
    "odd_new_entries": {
        "messages": [
            {"type": "tool_selection", "turn": "one", "offered": "all", "fallback": 3},
            {"type": "tool_selection", "turn": 1, "offered": [{"name": "a", "score": "high", "why": ["x"]}, "b"]},
            {"type": "parallel_calls", "calls": [{"tool": "a", "start_ms": "x"}, 3], "max_overlap": None},
            {"type": "tool_withdrawn", "tool": None, "corrections": "many"},
            {"type": "prompt", "ok": "yes", "arguments": [1]},
            {"type": "resource", "ok": False, "chars": "x"},
            {"type": "resource_tool", "offered": False},
            {"type": "flow_node", "updated": "keys"},
            {"type": "model_error", "attempts": []},
            {"type": "ai", "content": "", "tool_calls": [{"id": ["x"], "name": "a", "args": {}}]},
            {"type": "tool", "tool_call_id": {"a": 1}, "name": "t", "content": "x"},
        ]
    },
}


@pytest.mark.parametrize("shape", list(ODD))
def test_every_run_page_answers_whatever_shape_the_stored_run_has(admin_client, shape: str) -> None:
    agent = Agent.objects.create(slug="odd", name="odd")
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.FAILED, error_code="x", **ODD[shape])
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={},
        call_hash="0" * 64,
        call_id="c1",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    for url in (
        f"/admin/agents/run/{run.pk}/timeline/",
        f"/admin/agents/run/{run.pk}/change/",
        f"/admin/agents/approval/{approval.pk}/change/",
        f"/admin/agents/approval/{approval.pk}/decide/reject/",
        "/admin/agents/run/",
    ):
        assert admin_client.get(url).status_code == 200, url
